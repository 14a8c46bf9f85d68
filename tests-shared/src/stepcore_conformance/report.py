"""A pytest plugin that ends a run with what each backend's conformance tests showed.

Loaded only on opt-in: `pytest_plugins = ['stepcore_conformance']` in the rootdir's conftest.py, or
`-p stepcore_conformance` (the package names this module in its own `pytest_plugins`). It prints
nothing unless kit tests ran. For every test class built on the kit it lists the sections with
their outcomes and a verdict per optional feature, taken from what the store declares:

- declared, and every test of the feature passed: `passed`;
- declared, and a test of it failed or was skipped: `FAILED`, naming those tests;
- not declared: `not declared` (its tests were skipped, never counted as passing).

It also adds a hint to the error of a store class that leaves an abstract `StepStore` method
unimplemented, and prints the lines tests attach to their report under `SUMMARY_PROPERTY`: a kit
test's beside its class (the crash-window kill count), any other test's under its own id (a
project's own kill counts), so a CI log shows them without `-s`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from stepcore.backend import ALL_FEATURES, MEDIA_COLLECTION, MEDIA_EXTERNALIZATION, PERSISTENT, SNAPSHOT_RETENTION

from ._declared import declared_by, features_of_test, refusing_class

__all__ = (
    'FEATURES',
    'MEDIA_FEATURES',
    'SUMMARY_PROPERTY',
    'pytest_configure',
    'pytest_fixture_setup',
    'pytest_runtest_makereport',
    'pytest_terminal_summary',
)

_PACKAGE = 'stepcore_conformance.'
_FIRST = (SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT)
MEDIA_FEATURES = (MEDIA_COLLECTION,)
"""The optional features of a media store the report gives a verdict on."""
FEATURES = (*_FIRST, *sorted(ALL_FEATURES - set(_FIRST) - set(MEDIA_FEATURES)))
"""The optional features of a step store the report gives a verdict on, in this order."""
_MEDIA_SECTIONS = frozenset({'media', 'media_collection', 'media_subclass'})
_STORE_FIXTURES = ('store', 'media_store')

SUMMARY_PROPERTY = 'stepcore_conformance_summary'
"""A test calls `record_property(SUMMARY_PROPERTY, line)` to print `line` in the report."""

_NAMES_SHOWN = 4


@dataclass
class _Target:
    """What the kit tests of one test class showed."""

    sections: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter[str]))
    feature_tests: list[tuple[tuple[str, ...], str, str]] = field(
        default_factory=list[tuple[tuple[str, ...], str, str]]
    )
    """`(features, outcome, test name)` of every test of optional features."""
    declared: frozenset[str] | None = None
    store_class: str | None = None
    notes: list[str] = field(default_factory=list[str])


_TARGETS = pytest.StashKey[dict[str, _Target]]()
_OTHER_NOTES = pytest.StashKey[list[tuple[str, str]]]()
"""`(test id, line)` of the summary lines of tests outside the kit."""
_STORE_CLASS = pytest.StashKey[tuple[str, list[str]]]()
"""On a kit test's item: the name and declared features of the store class its fixture built."""
_KIT_PROPERTY = 'stepcore_conformance_kit'
"""What a kit test's report carries for the closing report: its target, section, features and store
class. It travels with the report, so the report is made where the reports are read (with
pytest-xdist, in the process that prints, not the one that ran the test)."""


def _summaries(report: pytest.TestReport) -> list[str]:
    return [str(value) for name, value in report.user_properties if name == SUMMARY_PROPERTY]


def _section(item: pytest.Item) -> str | None:
    function = getattr(item, 'function', None)
    module: str = getattr(function, '__module__', '') or ''
    if not module.startswith(_PACKAGE):
        return None
    return module[len(_PACKAGE) :]


def _target_name(nodeid: str) -> str:
    owner = nodeid.split('::')
    return '::'.join(owner[:2]) if len(owner) > 2 else owner[0]


def _remember_store_class(item: pytest.Item, cls: type) -> None:
    if _STORE_CLASS not in item.stash:
        item.stash[_STORE_CLASS] = (cls.__name__, sorted(declared_by(cls)))


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, Any, Any]:
    """Note the class of the store a kit test builds; explain an abstract store class."""
    item: object = getattr(request, 'node', None)
    if fixturedef.argname not in _STORE_FIXTURES or not isinstance(item, pytest.Item) or _section(item) is None:
        return (yield)
    try:
        value = yield
    except NotImplementedError as error:
        cls = refusing_class(error)
        if cls is not None:
            _remember_store_class(item, cls)
        raise
    except TypeError as error:
        if 'abstract' not in str(error):
            raise
        raise TypeError(
            f'{error}. A StepStore implements every abstract method of stepcore.StepStore (delete_run included); '
            'subclass stepcore.backend.EngineStore to have them all implemented over a small port'
        ) from error
    built: type = type(cast(object, value))
    if isinstance(getattr(built, 'features', None), frozenset):
        _remember_store_class(item, built)
    return value


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach to a kit test's report what the closing report needs of the test."""
    report = yield
    section = _section(item)
    if section is not None:
        store_class = item.stash.get(_STORE_CLASS, None)
        features = features_of_test(getattr(item, 'function', None))
        kit: dict[str, Any] = {
            'section': section,
            'features': sorted(features),
            'name': item.name,
            'store_class': None if store_class is None else store_class[0],
            'declared': None if store_class is None else store_class[1],
        }
        report.user_properties.append((_KIT_PROPERTY, kit))
    return report


class _Collector:
    """Reads the reports of one pytest run into its config's stash."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        found = next((value for name, value in report.user_properties if name == _KIT_PROPERTY), None)
        kit = cast(dict[str, Any] | None, found)
        if kit is None:
            if report.when == 'call':
                notes = self.config.stash.setdefault(_OTHER_NOTES, [])
                notes += [(report.nodeid, line) for line in _summaries(report)]
            return
        if not (report.when == 'call' or (report.when == 'setup' and report.outcome != 'passed')):
            return
        targets = self.config.stash.setdefault(_TARGETS, {})
        target = targets.setdefault(_target_name(report.nodeid), _Target())
        if target.declared is None and kit['declared'] is not None:
            target.declared = frozenset(cast(list[str], kit['declared']))
            target.store_class = kit['store_class']
        target.sections[kit['section']][report.outcome] += 1
        if kit['features']:
            target.feature_tests.append((tuple(cast(list[str], kit['features'])), report.outcome, str(kit['name'])))
        target.notes += _summaries(report)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_Collector(config), f'stepcore_conformance_collector_{id(config)}')


def _names(names: list[str]) -> str:
    shown = ', '.join(names[:_NAMES_SHOWN])
    return shown + (f' and {len(names) - _NAMES_SHOWN} more' if len(names) > _NAMES_SHOWN else '')


def verdict(target: _Target, feature: str) -> str:
    """The verdict on `feature` for one test class (see the module docstring)."""
    if target.declared is None:
        return 'unknown (no store was built)'
    if feature not in target.declared:
        return 'not declared'
    # A test of several features counts once the store declares them all (else it is skipped for another).
    outcomes: defaultdict[str, list[str]] = defaultdict(list[str])
    for features, outcome, name in target.feature_tests:
        if feature in features and target.declared.issuperset(features):
            outcomes[outcome].append(name)
    if not outcomes:
        return 'declared, not exercised by this class'
    failed, skipped = outcomes['failed'], outcomes['skipped']
    if failed or skipped:
        why = [
            f'{len(names)} {word}: {_names(names)}'
            for word, names in (('failed', failed), ('skipped', skipped))
            if names
        ]
        return f'FAILED ({"; ".join(why)})'
    passed = len(outcomes['passed'])
    return f'passed ({passed} test{"" if passed == 1 else "s"})'


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    targets = config.stash.get(_TARGETS, None) or dict[str, _Target]()
    others = config.stash.get(_OTHER_NOTES, None) or list[tuple[str, str]]()
    if not targets and not others:
        return
    terminalreporter.section('stepcore conformance')
    for nodeid, line in others:
        terminalreporter.write_line(nodeid)
        for part in line.splitlines():
            terminalreporter.write_line(f'  {part}')
    for name in sorted(targets):
        target = targets[name]
        if not target.sections:
            continue
        parts = [
            f'{section} ' + '/'.join(f'{n} {outcome}' for outcome, n in sorted(counts.items()))
            for section, counts in sorted(target.sections.items())
        ]
        terminalreporter.write_line(name + (f' ({target.store_class})' if target.store_class else ''))
        terminalreporter.write_line('  sections: ' + '; '.join(parts))
        features = MEDIA_FEATURES if set(target.sections) <= _MEDIA_SECTIONS else FEATURES
        terminalreporter.write_line(
            '  features: ' + ', '.join(f'{feature}: {verdict(target, feature)}' for feature in features)
        )
        for note in target.notes:
            terminalreporter.write_line(f'  {note}')
