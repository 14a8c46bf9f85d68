"""The demo's child process: runs the assistant until the parent kills it inside `send_email`.

python -m stepcore.cli.demo_worker --database DB --workdir DIR --marker FILE
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import cast

from stepcore.cli.demo_agents import CONVERSATION_ID, FIRST_RUN_ID, PROMPT, build_agents
from stepcore.plugins.registry import store_from_spec
from stepcore.store.step_store import StepStore


def _say(line: str) -> None:
    print(line, flush=True)


async def _main(database: Path, workdir: Path, marker: Path) -> None:
    store = cast(StepStore, store_from_spec('sqlite', database=database))
    try:
        agents = build_agents(store, workdir, say=_say, hang_marker=marker)
        await agents.assistant.run(PROMPT, run_id=FIRST_RUN_ID, conversation_id=CONVERSATION_ID)
    finally:
        await store.aclose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog='python -m stepcore.cli.demo_worker', description=__doc__)
    parser.add_argument('--database', type=Path, required=True)
    parser.add_argument('--workdir', type=Path, required=True)
    parser.add_argument('--marker', type=Path, required=True)
    args = parser.parse_args(argv)
    asyncio.run(_main(args.database, args.workdir, args.marker))


if __name__ == '__main__':
    main()
