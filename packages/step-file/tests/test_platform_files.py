"""The file store's files on Windows and macOS, simulated on any system: every descriptor opened in
binary mode, replacements and deletions that wait for another process's handle to close, and the
`full_fsync` option that trades macOS's `F_FULLFSYNC` for its plain `fsync`."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from media_disk import DiskMediaStore
from step_file import FileStepStore, files
from stepcore import ContinuableSnapshot, EventKind, RunRecord, StepEvent, ToolEffectRecord, ToolEffectStatus
from stepcore.ownership import open_lease

O_BINARY = 0x4000_0000
"""A stand-in for Windows' `O_BINARY`: a bit no Linux or macOS `open` flag uses."""
SHARING_VIOLATION = 32


def messages(n: int) -> list[ModelMessage]:
    found: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
    for i in range(n):
        found.append(ModelResponse(parts=[TextPart(f'step {i}\r\nline two\n')]))
        found.append(ModelRequest(parts=[UserPromptPart(f'next {i}')]))
    return found


async def write_a_run(store: FileStepStore, run_id: str, *, steps: int = 2) -> None:
    """A run with every kind of file: record, events, ledger, messages, snapshots and their keys."""
    await store.register_run(RunRecord(run_id=run_id))
    for step in range(1, steps + 1):
        await store.append_event(StepEvent(run_id=run_id, kind=EventKind.MODEL_REQUEST_COMPLETED, step_index=step))
        await store.record_tool_effect(
            ToolEffectRecord(
                run_id=run_id,
                tool_call_id=f'c{step}',
                tool_name='t',
                status=ToolEffectStatus.COMPLETED,
                step_index=step,
            )
        )
        await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=step, messages=messages(step)))


# -- O_BINARY -------------------------------------------------------------------------------------


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every `os.open` made, as (path, flags), with `os.O_BINARY` set to `O_BINARY` as on Windows.

    The stand-in bit is taken off again before the real call, which this system would not know.
    """
    monkeypatch.setattr(os, 'O_BINARY', O_BINARY, raising=False)
    calls: list[tuple[str, int]] = []
    real_open = os.open

    def open_(path: str | os.PathLike[str], flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        calls.append((os.fspath(path), flags))
        return real_open(path, flags & ~O_BINARY, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, 'open', open_)
    return calls


def _files_opened(calls: list[tuple[str, int]], root: Path) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for path, flags in calls:
        if path.startswith(str(root)) and not os.path.isdir(path):
            found.setdefault(os.path.relpath(path, root), []).append(flags)
    return found


async def test_every_file_of_a_run_is_opened_in_binary_mode(opened: list[tuple[str, int]], tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, durability='full')
    await write_a_run(store, 'r')
    await open_lease(store, 'leased', ttl=60.0, start=messages(1))
    fresh = FileStepStore(tmp_path)  # reads every log from the start
    assert [s.step_index for s in await fresh.list_snapshots('r')] == [1, 2]
    assert (await fresh.latest_snapshot('r')) is not None
    assert len(await fresh.list_events('r')) == 2
    assert await fresh.get_lease('leased') is not None
    await store.aclose()
    await fresh.aclose()

    by_file = _files_opened(opened, tmp_path)
    names = {Path(name).name for name in by_file}
    # the lock, each log, the snapshot files, the lease and the lease index, all through os.open
    assert {'.lock', 'events.jsonl', 'tool_effects.jsonl', 'messages.jsonl', 'snapshot-keys.jsonl'} <= names
    assert {'lease.json', 'leased'} <= names
    assert any(name.startswith('.run.json.') for name in names)  # the run record's temporary file
    assert any(name.startswith('.1.json.') for name in names)  # a snapshot's temporary file
    text_mode = {name: flags for name, flags in by_file.items() if any(not f & O_BINARY for f in flags)}
    assert text_mode == {}


async def test_the_lease_file_is_read_in_binary_mode(opened: list[tuple[str, int]], tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    await open_lease(store, 'leased', ttl=60.0, start=messages(1))
    opened.clear()
    assert await store.get_lease('leased') is not None
    await store.aclose()
    reads = [flags for path, flags in opened if path.endswith('lease.json')]
    assert reads
    assert all(flags & O_BINARY and flags & (os.O_WRONLY | os.O_RDWR) == 0 for flags in reads)


def test_the_run_lock_and_the_logs_open_in_binary_mode(opened: list[tuple[str, int]], tmp_path: Path) -> None:
    with files.run_lock(tmp_path / 'lock', exclusive=True):
        pass
    with files.run_lock(tmp_path / 'lock', exclusive=False):
        pass
    log = files.Log(tmp_path / 'log.jsonl', Lines)
    with log.writing() as fd:
        log.append(fd, b'{"a":1}\n', sync=True)
    with log.writing() as fd:  # the file exists now: opened, not created
        pass
    files.Log(tmp_path / 'log.jsonl', Lines).refresh(repair=True)
    opened_files = [(Path(path).name, flags) for path, flags in opened if not os.path.isdir(path)]
    # the lock: tried, created, opened by a reader; the log: tried, created, opened again, read to repair
    assert [name for name, _ in opened_files] == ['lock'] * 3 + ['log.jsonl'] * 4
    assert all(flags & O_BINARY for _, flags in opened_files)


class Lines:
    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def add(self, number: int, line: bytes) -> None:
        self.lines.append(line)


# -- files another process holds open, on Windows ------------------------------------------------


class Sharing:
    """`os.replace` and `os.unlink` failing as on Windows while a handle is open on the file.

    The next `fail` calls on a path named `where` (either path of a rename) raise `PermissionError`
    with `winerror` 32, as when another process holds it open. A folder holding a file this process
    has open (`os.open` without `os.close`) is never renamed: `winerror` 5, as Windows answers.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fail = 0
        self.where = ''
        self.refused: list[str] = []
        self.waits: list[float] = []
        self.open: dict[int, str] = {}
        self._real = {'replace': os.replace, 'unlink': os.unlink}
        real_open, real_close = os.open, os.close

        def open_(path: str | os.PathLike[str], flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
            fd = real_open(path, flags, mode, dir_fd=dir_fd)
            self.open[fd] = os.path.abspath(path)
            return fd

        def close(fd: int) -> None:
            self.open.pop(fd, None)
            real_close(fd)

        monkeypatch.setattr(os, 'open', open_)
        monkeypatch.setattr(os, 'close', close)
        monkeypatch.setattr(os, 'replace', self._wrap('replace'))
        monkeypatch.setattr(os, 'unlink', self._wrap('unlink'))
        monkeypatch.setattr('stepcore.backend_io.files.time.sleep', self.waits.append)

    def _holds_open(self, folder: Any) -> bool:
        inside = os.path.abspath(folder) + os.sep
        return os.path.isdir(folder) and any(path.startswith(inside) for path in self.open.values())

    def _wrap(self, name: str) -> Any:
        real = self._real[name]

        def call(*args: Any, **kwargs: Any) -> None:
            named = [Path(a).name for a in args if isinstance(a, str | Path)]
            if name == 'replace' and self._holds_open(args[0]):
                self.refused.append(f'{name} {named[0]} (a file in it is open)')
                error = PermissionError(13, 'Access is denied')
                error.winerror = 5  # type: ignore[attr-defined]  # set by Windows' OSError
                raise error
            if self.fail and self.where in named:
                self.fail -= 1
                self.refused.append(f'{name} {self.where}')
                error = PermissionError(13, 'The process cannot access the file because it is being used')
                error.winerror = SHARING_VIOLATION  # type: ignore[attr-defined]  # set by Windows' OSError
                raise error
            real(*args, **kwargs)

        return call


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> Sharing:
    """Windows' rules for replacing and deleting open files; the run lock stays `flock`, since the
    simulation has no `LockFileEx` (`test_platform_locks.py` simulates that)."""
    monkeypatch.setattr(sys, 'platform', 'win32')
    monkeypatch.setattr(files, '_lock_windows', files._lock_posix)  # pyright: ignore[reportPrivateUsage]
    return Sharing(monkeypatch)


async def test_a_snapshot_replaced_while_read_elsewhere_is_written_after_a_wait(
    windows: Sharing, tmp_path: Path
) -> None:
    store = FileStepStore(tmp_path, durability='full')
    await store.register_run(RunRecord(run_id='r'))
    windows.where, windows.fail = '1.json', 3
    await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=messages(1)))
    assert windows.refused == ['replace 1.json'] * 3
    assert windows.waits == [0.01, 0.02, 0.04]
    assert (await store.latest_snapshot('r')) is not None
    await store.aclose()


async def test_a_pruned_snapshot_held_open_elsewhere_is_removed_after_a_wait(windows: Sharing, tmp_path: Path) -> None:
    store = FileStepStore(tmp_path, max_snapshots_per_run=1)
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=messages(1)))
    windows.where, windows.fail = '1.json', 2
    await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=2, messages=messages(2)))
    assert windows.refused == ['unlink 1.json', 'unlink 1.json']
    assert sorted(p.name for p in (tmp_path / 'r' / 'snapshots').iterdir()) == ['2.json']
    await store.aclose()


async def test_a_lease_file_read_elsewhere_is_swapped_after_a_wait(
    windows: Sharing, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def alive(pid: int) -> bool:  # the simulation has no tasklist: this process is the only one
        return pid == os.getpid()

    monkeypatch.setattr('stepcore.ownership.identity._windows_process_alive', alive)
    store = FileStepStore(tmp_path)
    windows.where, windows.fail = 'lease.json', 2
    lease = await open_lease(store, 'leased', ttl=60.0, start=messages(1))
    assert windows.refused == ['replace lease.json', 'replace lease.json']
    stored = await store.get_lease('leased')
    assert stored is not None
    assert (stored.epoch, stored.owner) == (lease.epoch, lease.owner)
    await store.aclose()


async def test_a_run_is_deleted_while_its_lock_file_is_open(windows: Sharing, tmp_path: Path) -> None:
    # Windows will not rename a folder with an open file in it, and the delete holds the run's lock
    # file open: the run's files move out one by one, and the folder stays with its lock file only.
    store = FileStepStore(tmp_path)
    await write_a_run(store, 'r', steps=2)
    await open_lease(store, 'r', ttl=60.0, start=messages(1))
    windows.where, windows.fail = 'events.jsonl', 2  # a reader elsewhere closes it after a while
    assert await store.delete_run('r')
    assert windows.refused == ['replace events.jsonl', 'replace events.jsonl']
    assert await store.get_run('r') is None
    assert await store.get_lease('r') is None
    assert await store.list_runs() == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(('r', '.r.'))) == ['r']
    assert [p.name for p in (tmp_path / 'r').iterdir()] == ['.lock']

    await write_a_run(store, 'r', steps=1)  # the same id again starts from nothing
    assert [s.step_index for s in await store.list_snapshots('r')] == [1]
    assert len(await store.list_events('r')) == 1
    await store.aclose()


async def test_a_delete_cut_short_on_windows_leaves_the_run_and_finishes_when_repeated(
    windows: Sharing, tmp_path: Path
) -> None:
    store = FileStepStore(tmp_path)
    await write_a_run(store, 'r', steps=2)
    windows.where, windows.fail = 'run.json', 100  # the record, moved last, stays open elsewhere
    with pytest.raises(PermissionError, match=r'run\.json'):
        await store.delete_run('r')
    assert [r.run_id for r in await store.list_runs()] == ['r']  # still listed: not gone half-way
    windows.fail = 0
    assert await store.delete_run('r')
    assert await store.list_runs() == []
    assert not any(p.name.startswith('.r.') for p in tmp_path.iterdir())
    await store.aclose()


async def test_elsewhere_a_run_folder_is_set_aside_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, 'platform', 'darwin')
    renamed: list[tuple[str, str]] = []
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        renamed.append((Path(src).name, Path(dst).name.split('.deleted.')[0]))
        real(src, dst)

    store = FileStepStore(tmp_path)
    await write_a_run(store, 'r', steps=1)
    monkeypatch.setattr(os, 'replace', replace)
    assert await store.delete_run('r')
    assert renamed == [('r', '.r')]  # one rename of the folder, its lock file inside
    assert not (tmp_path / 'r').exists()
    await store.aclose()


async def test_a_file_that_stays_open_fails_the_write_naming_it(windows: Sharing, tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='r'))
    windows.where, windows.fail = '1.json', 100
    with pytest.raises(PermissionError) as raised:
        await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=messages(1)))
    error = raised.value
    assert error.filename2 == str(tmp_path / 'r' / 'snapshots' / '1.json')
    assert 'another program still has it open after 10 tries' in str(error)
    assert len(windows.waits) == 9
    assert not [p.name for p in (tmp_path / 'r' / 'snapshots').iterdir()]  # the temporary file is removed
    windows.fail = 0
    await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=messages(1)))
    assert (await store.latest_snapshot('r')) is not None
    await store.aclose()


async def test_linux_replaces_and_deletes_without_waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, 'platform', 'linux')
    sharing = Sharing(monkeypatch)
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='r'))
    sharing.where, sharing.fail = '1.json', 1  # a PermissionError here is a real one: never retried
    with pytest.raises(PermissionError):
        await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=messages(1)))
    assert sharing.waits == []
    await store.aclose()


# -- full_fsync on macOS ---------------------------------------------------------------------------


class MacFcntl(types.ModuleType):
    """`fcntl` of a simulated macOS: `F_FULLFSYNC` is recorded, `flock` is the real one."""

    F_FULLFSYNC = 51

    def __init__(self) -> None:
        super().__init__('fcntl')
        import fcntl

        self.flock = fcntl.flock
        self.LOCK_SH, self.LOCK_EX, self.LOCK_NB = fcntl.LOCK_SH, fcntl.LOCK_EX, fcntl.LOCK_NB
        self.full: list[int] = []

    def fcntl(self, fd: int, cmd: int) -> int:
        assert cmd == self.F_FULLFSYNC
        self.full.append(fd)
        return 0


@pytest.fixture
def darwin(monkeypatch: pytest.MonkeyPatch) -> tuple[MacFcntl, list[int]]:
    pytest.importorskip('fcntl', reason='the simulated macOS locks runs with the real flock')
    monkeypatch.setattr(sys, 'platform', 'darwin')
    fake = MacFcntl()
    monkeypatch.setitem(sys.modules, 'fcntl', fake)
    fsynced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        fsynced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, 'fsync', fsync)
    return fake, fsynced


async def test_darwin_flushes_with_full_fsync_by_default(darwin: tuple[MacFcntl, list[int]], tmp_path: Path) -> None:
    fake, fsynced = darwin
    store = FileStepStore(tmp_path, durability='full')
    await write_a_run(store, 'r', steps=1)
    await store.aclose()
    assert fake.full
    assert fsynced == []


async def test_darwin_full_fsync_false_takes_the_plain_fsync(
    darwin: tuple[MacFcntl, list[int]], tmp_path: Path
) -> None:
    fake, fsynced = darwin
    store = FileStepStore(tmp_path, durability='full', full_fsync=False)
    await write_a_run(store, 'r', steps=1)
    media = store.media_store
    assert isinstance(media, DiskMediaStore)
    assert media.full_fsync is False  # the default media store follows the store
    await store.aclose()
    assert fsynced
    assert fake.full == []


async def test_full_fsync_true_is_the_default_on_darwin(darwin: tuple[MacFcntl, list[int]], tmp_path: Path) -> None:
    fake, fsynced = darwin
    store = FileStepStore(tmp_path, durability='full', full_fsync=True)
    await write_a_run(store, 'r', steps=1)
    await store.aclose()
    assert fake.full
    assert fsynced == []


def test_full_fsync_must_be_a_bool_or_none(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="full_fsync='no' must be True, False or None"):
        FileStepStore(tmp_path, full_fsync='no')  # type: ignore[arg-type]
