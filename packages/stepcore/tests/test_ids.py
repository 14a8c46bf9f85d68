"""Run id rules."""

from __future__ import annotations

import itertools
import re

import pytest

from stepcore.store.ids import MAX_RUN_ID_LENGTH, derive_run_id, dotted_run_id, validate_path_safe_run_id


@pytest.mark.parametrize('run_id', ['a', 'run-1', 'A_b.c-9', 'x' * MAX_RUN_ID_LENGTH, '.hidden', 'a.b'])
def test_path_safe_ids_are_accepted(run_id: str) -> None:
    assert validate_path_safe_run_id(run_id) == run_id


@pytest.mark.parametrize(
    'run_id',
    ['', '.', '..', '../x', 'a/b', 'a\\b', 'a..b', 'x' * (MAX_RUN_ID_LENGTH + 1), 'space here', 'ü', 'a\n', None, 3],
)
def test_unsafe_ids_are_refused_with_the_rule(run_id: object) -> None:
    with pytest.raises(ValueError, match=re.escape('is not path-safe: use 1-200 of A-Z a-z 0-9 _ . -')) as raised:
        validate_path_safe_run_id(run_id)
    assert repr(run_id) in str(raised.value)


def test_derived_ids_are_path_safe() -> None:
    run_id = derive_run_id('code librarian/ü', '3f2a:run')
    assert validate_path_safe_run_id(run_id) == run_id
    assert run_id.startswith('sp-')


def test_derivation_is_injective_on_tricky_pairs() -> None:
    names = ['a', 'a.b', 'b', 'a.', '.b', 'ab', 'é', '==', '-_', ' ', '', '1', '1:', ':']
    pairs = list(itertools.product(names, repeat=2))
    derived = {derive_run_id(agent, run) for agent, run in pairs}
    assert len(derived) == len(pairs)


def test_derivation_is_deterministic() -> None:
    assert derive_run_id('agent', 'run') == derive_run_id('agent', 'run')


def test_too_long_derived_id_is_refused_with_advice() -> None:
    with pytest.raises(ValueError, match='exceeds the 200-character limit') as raised:
        derive_run_id('agent' * 40, 'run')
    assert 'shorter agent_name' in str(raised.value)


def test_dotted_run_id_gives_the_older_derivation_back() -> None:
    assert dotted_run_id(derive_run_id('librarian', 'run-1')) == 'bGlicmFyaWFu.cnVuLTE'
    assert dotted_run_id(derive_run_id('code librarian/ü', '3f2a:run')) == 'Y29kZSBsaWJyYXJpYW4vw7w.M2YyYTpydW4'
    assert validate_path_safe_run_id('bGlicmFyaWFu.cnVuLTE')


@pytest.mark.parametrize('run_id', ['run-1', 'sp-', 'sp-!!', 'sp-MDpydW4tMQ', 'sp-NTphZ2VudA', 'sp-OTph'])
def test_dotted_run_id_is_none_for_ids_it_cannot_have_come_from(run_id: str) -> None:
    # not derived; empty; not base64; empty agent name; empty run id; a length longer than the rest
    assert dotted_run_id(run_id) is None
