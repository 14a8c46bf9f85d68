"""The agents of the commands that take `--agent` and a store (`resume`, `recover --orphans`): loading
them, and the check that each keeps its runs in the store the command line names.

A resumption is recorded by the agent's `StepPersistence`, in the store that agent opens; the command
claims and settles the run in the store `--store` names. When the two differ (another database, or a
copy of the same one), the command would claim the run in one store and record its resumption in the
other: so it refuses, before it claims, settles or writes anything.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from rich.text import Text

from stepcore.cli.console import CliError, err, fail
from stepcore.cli.stores import ENV_VAR, StoreError, resolve_store_url
from stepcore.store.step_store import StepStore

__all__ = ('check_agent_stores', 'load_agents')


def load_agents(url: str | None, specs: Sequence[str]) -> list[tuple[str, Any]]:
    """Each `MODULE:ATTR` of `specs` with the agent it names, imported (from the current directory
    too) while `$STEPCORE_STORE` holds the store the command line names, so that an agent module
    that opens the store it names there opens that one. Exits with status 1, saying why, when one
    cannot be had."""
    try:
        given = resolve_store_url(url)
    except StoreError as exc:
        fail(str(exc))
    previous = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = given
    try:
        loaded = [(spec, _load_agent(spec)) for spec in specs]
    except ValueError as exc:
        fail(str(exc))
    finally:
        if previous is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = previous
    return loaded


def _load_agent(spec: str) -> Any:
    """The object `MODULE:ATTR` names (an agent), imported from the current directory too."""
    module_name, sep, attr = spec.partition(':')
    if not sep or not module_name or not attr:
        raise ValueError(f'--agent {spec!r} is not MODULE:ATTR: write e.g. myapp.agents:support_agent')
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split('.'):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f'--agent {spec!r} cannot be imported: {exc}') from exc
    if not callable(getattr(found, 'run', None)):
        raise ValueError(f'--agent {spec!r} is a {type(found).__name__}, not a pydantic-ai Agent')
    return found


async def check_agent_stores(store: StepStore, agents: Sequence[tuple[str, Any]], *, action: str) -> None:
    """Refuse (`CliError`, exit status 1) unless every `StepPersistence` of each agent keeps its runs
    in `store`, the store the command line names; `action` says what the command would do
    (`resume run ops-7`). Where that cannot be told (a store that keeps no store id), a warning says so
    and the command goes on."""
    from stepcore.capability.persistence import step_persistences
    from stepcore.store.same_store import same_store

    for spec, agent in agents:
        attached = step_persistences(agent) if hasattr(agent, 'root_capability') else []
        if not attached:
            raise CliError(
                f'cannot {action}: --agent {spec} has no StepPersistence, so nothing would record the resumed run. '
                'Attach StepPersistence to the agent, on the store --store names'
            )
        for persistence in attached:
            names = (f'the store of --agent {spec}', 'the store --store names')
            same, why = await same_store(persistence.store, store, names=names)
            if same is None:
                err().print(
                    Text.assemble(('warning:', 'bold yellow'), f' {why}: the command goes on as if they were one'),
                    soft_wrap=True,
                )
            elif not same:
                raise CliError(
                    f'cannot {action}: {why}. Nothing was changed. Point -s/--store at the store the agent uses, '
                    f'or have the agent module open the store the command line names (it is in ${ENV_VAR} while '
                    'the module is imported)'
                )
