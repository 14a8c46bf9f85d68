"""Reading a folder written by pydantic-ai-harness's file store.

Every release from 0.52 to 0.62 lays it out the same way:

    <root>/<run_id>/run.json             the run record
    <root>/<run_id>/events.jsonl         one event per line, in append order
    <root>/<run_id>/tool_effects.jsonl   ledger entries, appended: the last line of a call is its state
    <root>/<run_id>/snapshots/<n>.json   one snapshot per file, `n` counting up (pruned ones leave gaps)
    <root>/media/<sha256>.bin            externalized payloads

Snapshots without a `state` read as complete, as the harness reads them; `snapshot-keys.jsonl`
(the keys of saved snapshots, pruned ones included) is not imported: a snapshot's own key is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from pydantic_ai.messages import ModelMessage

from stepcore.harness.records import effect_from_harness, event_from_harness, run_from_harness, snapshot_from_harness
from stepcore.harness.source import HarnessRun, HarnessSource, decode_history
from stepcore.store.models import ContinuableSnapshot

__all__ = ('HarnessFileSource', 'is_harness_folder')

RUN_FILE = 'run.json'
EVENTS_FILE = 'events.jsonl'
EFFECTS_FILE = 'tool_effects.jsonl'
SNAPSHOTS_DIR = 'snapshots'
MEDIA_DIR = 'media'
STEPCORE_MESSAGES_FILE = 'messages.jsonl'
STEPCORE_STAMP = b'{"format":'
"""How stepcore's own file store starts each record it writes."""
_RUN_ENTRIES = (RUN_FILE, EVENTS_FILE, EFFECTS_FILE, SNAPSHOTS_DIR)


def _is_run_folder(path: Path) -> bool:
    return path.is_dir() and any((path / entry).exists() for entry in _RUN_ENTRIES)


def _is_stepcore_folder(path: Path) -> bool:
    """A run folder of stepcore's own file store (same file names, but a message log and stamped records)."""
    if (path / STEPCORE_MESSAGES_FILE).exists():
        return True
    try:
        with (path / RUN_FILE).open('rb') as f:
            return f.read(len(STEPCORE_STAMP)) == STEPCORE_STAMP
    except OSError:
        return False


def is_harness_folder(directory: Path) -> bool:
    """Whether `directory` holds run folders of the harness's layout (and none of stepcore's own)."""
    if not directory.is_dir():
        return False
    runs = [child for child in directory.iterdir() if _is_run_folder(child)]
    return bool(runs) and not any(_is_stepcore_folder(child) for child in runs)


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f'expected a JSON object, found {type(value).__name__}')
    return cast(dict[str, Any], value)


class HarnessFileSource(HarnessSource):
    """The runs under a harness file store's root folder."""

    def __init__(self, directory: Path) -> None:
        if not directory.is_dir():
            raise ValueError(f'{str(directory)!r} is not a folder: point at the root folder of a harness file store')
        ours = next(
            (child for child in directory.iterdir() if _is_run_folder(child) and _is_stepcore_folder(child)), None
        )
        if ours is not None:
            raise ValueError(
                f'{str(directory)!r} is a stepcore file store (run folder {ours.name!r} was written by stepcore), '
                f'not a pydantic-ai-harness one: open it as it is, with --store file://{directory.resolve()}'
            )
        self._root = directory

    def describe(self) -> str:
        return f'folder {str(self._root)!r}'

    def close(self) -> None:
        """Nothing to release: each file is closed once read."""

    def run_ids(self) -> list[str]:
        recorded: list[tuple[str, str]] = []
        unrecorded: list[str] = []
        for child in sorted(self._root.iterdir()):
            if not _is_run_folder(child):
                continue
            try:
                started = str(_json_object((child / RUN_FILE).read_text(encoding='utf-8'))['started_at'])
            except FileNotFoundError:
                unrecorded.append(child.name)
                continue
            except (OSError, ValueError, KeyError):
                started = ''  # read_run names what is wrong with it
            recorded.append((started, child.name))
        return [name for _, name in sorted(recorded)] + unrecorded

    def read_run(self, run_id: str) -> HarnessRun:
        folder = self._root / run_id
        run = HarnessRun(run_id=run_id)
        if (folder / RUN_FILE).exists():
            run.record = run.read(
                f'the run record {RUN_FILE}',
                lambda: run_from_harness(_json_object((folder / RUN_FILE).read_text(encoding='utf-8'))),
            )
            if run.record is None:
                return run
        for number, line in self._lines(run, folder / EVENTS_FILE):
            event = run.read(
                f'line {number} of {EVENTS_FILE}', lambda line=line: event_from_harness(_json_object(line))
            )
            if event is not None:
                run.events.append(event)
        for path in self._snapshot_files(folder / SNAPSHOTS_DIR):
            snapshot = run.read(
                f'snapshot {SNAPSHOTS_DIR}/{path.name}', lambda path=path: self._snapshot(path, run.media)
            )
            if snapshot is not None:
                run.snapshots.append(snapshot)
        latest: dict[str, Any] = {}
        for number, line in self._lines(run, folder / EFFECTS_FILE):
            effect = run.read(
                f'line {number} of {EFFECTS_FILE}', lambda line=line: effect_from_harness(_json_object(line))
            )
            if effect is not None:
                latest.pop(effect.tool_call_id, None)
                latest[effect.tool_call_id] = effect
        run.tool_effects = list(latest.values())
        return run

    @staticmethod
    def _lines(run: HarnessRun, path: Path) -> list[tuple[int, str]]:
        text = run.read(path.name, lambda: path.read_text(encoding='utf-8') if path.exists() else '')
        return [(number, line) for number, line in enumerate((text or '').splitlines(), 1) if line.strip()]

    @staticmethod
    def _snapshot_files(directory: Path) -> list[Path]:
        if not directory.is_dir():
            return []
        numbered = [(int(path.stem), path) for path in directory.glob('*.json') if path.stem.isdigit()]
        return [path for _, path in sorted(numbered)]

    def _snapshot(self, path: Path, media: set[str]) -> ContinuableSnapshot:
        data = _json_object(path.read_text(encoding='utf-8'))
        for required in ('messages', 'timestamp', 'step_index'):
            if required not in data:
                raise ValueError(f'it has no {required!r} field')
        stored = data['messages']
        if not isinstance(stored, list):
            raise ValueError(f'its messages are {type(stored).__name__}, not a list')
        messages: list[ModelMessage] = decode_history(cast(list[Any], stored), self._blob, media)
        return snapshot_from_harness(data, messages)

    def _blob(self, digest: str) -> bytes:
        path = self._root / MEDIA_DIR / f'{digest}.bin'
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise LookupError(
                f'media+sha256://{digest} is not in {str(self._root / MEDIA_DIR)!r} (a harness store configured '
                'with another media store keeps it there)'
            ) from None
