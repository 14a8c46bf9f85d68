"""The kit's pytest plugin loads only where a project opts in, never just because the kit is installed.

Each case runs pytest in a fresh interpreter of this environment, where stepcore-conformance is
installed, on a project of its own (no conftest from this repository applies there).
"""

from __future__ import annotations

import pytest

pytest_plugins = ['pytester']

INI = '[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n'
OPT_IN = "pytest_plugins = ['stepcore_conformance']\n"

UNRELATED = """
import sys


def test_nothing_of_the_kit_is_loaded(request):
    assert 'stepcore_conformance' not in sys.modules
    assert 'stepcore' not in sys.modules
    assert not request.config.pluginmanager.has_plugin('stepcore_conformance')
"""

MEDIA_KIT = """
import pytest

from stepcore_conformance import InMemoryMediaStore, MediaStoreConformance


class TestInMemoryMedia(MediaStoreConformance):
    @pytest.fixture
    async def media_store(self):
        return InMemoryMediaStore()
"""


def test_an_installed_kit_stays_out_of_an_unrelated_project(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)
    pytester.makepyfile(test_unrelated=UNRELATED)  # pyright: ignore[reportUnknownMemberType]
    outcome = pytester.runpytest_subprocess('-p', 'no:cacheprovider')
    outcome.assert_outcomes(passed=1)
    assert 'stepcore conformance' not in outcome.stdout.str()


def test_kit_tests_without_opt_in_run_but_print_no_report(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)
    pytester.makepyfile(test_media=MEDIA_KIT)  # pyright: ignore[reportUnknownMemberType]
    outcome = pytester.runpytest_subprocess('-p', 'no:cacheprovider')
    outcome.assert_outcomes(passed=28, skipped=1)
    assert 'stepcore conformance' not in outcome.stdout.str()


@pytest.mark.parametrize('how', ['conftest', 'command line'])
def test_opting_in_prints_the_closing_report(pytester: pytest.Pytester, how: str) -> None:
    pytester.makeini(INI)
    pytester.makepyfile(test_media=MEDIA_KIT)  # pyright: ignore[reportUnknownMemberType]
    args = ['-p', 'no:cacheprovider']
    if how == 'conftest':
        pytester.makeconftest(OPT_IN)
    else:
        args += ['-p', 'stepcore_conformance']
    outcome = pytester.runpytest_subprocess(*args)
    outcome.assert_outcomes(passed=28, skipped=1)
    outcome.stdout.fnmatch_lines(
        [
            '*= stepcore conformance =*',
            'test_media.py::TestInMemoryMedia (InMemoryMediaStore)',
            '  sections: media 15 passed/1 skipped; media_collection 11 passed; media_subclass 2 passed',
            '  features: media_collection: passed (10 tests)',
        ]
    )
