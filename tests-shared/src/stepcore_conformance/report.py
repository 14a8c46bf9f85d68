"""A pytest plugin that ends a run with what each backend's conformance tests showed.

Loaded through the `pytest11` entry point whenever stepcore-conformance is installed; it prints
nothing unless kit tests ran. For every test class built on the kit it lists the sections with
their outcomes and, for each optional feature, whether its tests passed, failed or were skipped,
so an undeclared feature can never be mistaken for a passing one.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Generator

import pytest

__all__ = ('FEATURE_SECTIONS', 'pytest_runtest_makereport', 'pytest_terminal_summary')

_PACKAGE = 'stepcore_conformance.'
FEATURE_SECTIONS = {
    'retention': 'snapshot_retention',
    'externalization': 'media_externalization',
    'persistence': 'persistent',
    'batches': 'write_batch',
}
"""Kit module -> the feature (or optional method, `write_batch`) its tests belong to."""

_RESULTS = pytest.StashKey[dict[str, dict[str, Counter[str]]]]()


def _section(item: pytest.Item) -> str | None:
    function = getattr(item, 'function', None)
    module: str = getattr(function, '__module__', '') or ''
    if not module.startswith(_PACKAGE):
        return None
    return module[len(_PACKAGE) :]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    section = _section(item)
    if section is None:
        return report
    if report.when == 'call' or (report.when == 'setup' and report.outcome != 'passed'):
        owner = item.nodeid.split('::')
        target = '::'.join(owner[:2]) if len(owner) > 2 else owner[0]
        results = item.config.stash.setdefault(_RESULTS, defaultdict(lambda: defaultdict(Counter[str])))
        results[target][section][report.outcome] += 1
    return report


def _verdict(counts: Counter[str], feature: str) -> str:
    if counts['failed']:
        return 'FAILED'
    if feature == 'write_batch':
        # the section's apply_writes checks run on every store; the others need the method itself
        return 'skipped (not implemented)' if counts['skipped'] else 'passed'
    if counts['passed']:
        return 'passed'
    return 'skipped (not declared)'


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    results = config.stash.get(_RESULTS, None)
    if not results:
        return
    terminalreporter.section('stepcore conformance')
    for target in sorted(results):
        sections = results[target]
        parts = [
            f'{name} ' + '/'.join(f'{n} {outcome}' for outcome, n in sorted(counts.items()))
            for name, counts in sorted(sections.items())
        ]
        terminalreporter.write_line(f'{target}')
        terminalreporter.write_line('  sections: ' + '; '.join(parts))
        features = [
            f'{feature}: {_verdict(sections[module], feature)}'
            for module, feature in FEATURE_SECTIONS.items()
            if module in sections
        ]
        if features:
            terminalreporter.write_line('  features: ' + ', '.join(features))
