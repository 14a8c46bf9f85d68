"""Concurrent writers: tasks sharing one store, and processes sharing one database."""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

from stepcore import RunRecord, StepStore, ToolEffectStatus
from stepcore.backend import PERSISTENT

from ._support import StoreFixtures, at, conversation, event, needs_feature, new_id, register, snapshot
from .effects import effect

__all__ = ('ConcurrencyConformance',)

WRITERS = 20
PER_WRITER = 10
HANG_GUARD_SECONDS = 600


def _check_trail(events: list[Any], writers: list[str], per_writer: int) -> None:
    """Nothing lost, seqs unique and in list order, each writer's own order preserved."""
    seqs = [e.seq for e in events]
    assert all(isinstance(s, int) for s in seqs), seqs
    assert len(set(seqs)) == len(seqs), 'two events share a seq'
    assert seqs == sorted(seqs), 'list_events is not in seq order'
    for writer in writers:
        mine = [int(e.metadata['i']) for e in events if e.metadata.get('writer') == writer]
        assert mine == list(range(per_writer)), f'writer {writer} lost or reordered events: {mine}'
    assert len(events) == len(writers) * per_writer


class ConcurrencyConformance(StoreFixtures):
    """Many concurrent writers to one run and to many runs."""

    async def test_many_writers_to_one_run(self, store: StepStore) -> None:
        run_id = await register(store)

        async def writer(w: int) -> None:
            for i in range(PER_WRITER):
                await store.append_event(event(run_id, i, metadata={'writer': str(w), 'i': str(i)}))

        async with anyio.create_task_group() as tg:
            for w in range(WRITERS):
                tg.start_soon(writer, w)
        _check_trail(await store.list_events(run_id=run_id), [str(w) for w in range(WRITERS)], PER_WRITER)

    async def test_many_writers_to_many_runs(self, store: StepStore) -> None:
        run_ids = [await register(store) for _ in range(WRITERS)]

        async def writer(run_id: str) -> None:
            for i in range(PER_WRITER):
                await store.append_event(event(run_id, i, metadata={'writer': run_id, 'i': str(i)}))
                if i % 3 == 0:
                    await store.save_snapshot(snapshot(run_id, conversation(i, tag=run_id), step_index=i))

        async with anyio.create_task_group() as tg:
            for run_id in run_ids:
                tg.start_soon(writer, run_id)
        for run_id in run_ids:
            _check_trail(await store.list_events(run_id=run_id), [run_id], PER_WRITER)
            listed = await store.list_snapshots(run_id=run_id)
            assert [s.messages for s in listed] == [conversation(i, tag=run_id) for i in (0, 3, 6, 9)]

    async def test_concurrent_snapshot_writers_to_one_run(self, store: StepStore) -> None:
        run_id = await register(store)
        tags = [f'writer-{w}' for w in range(8)]

        async def writer(tag: str) -> None:
            for step in range(4):
                await store.save_snapshot(
                    snapshot(run_id, conversation(step, tag=tag), step_index=step, metadata={'w': tag})
                )

        async with anyio.create_task_group() as tg:
            for tag in tags:
                tg.start_soon(writer, tag)
        listed = await store.list_snapshots(run_id=run_id)
        assert len(listed) == len(tags) * 4
        seqs = [s.seq for s in listed]
        assert len(set(seqs)) == len(seqs)
        for tag in tags:
            mine = [s for s in listed if s.metadata['w'] == tag]
            assert [s.step_index for s in mine] == [0, 1, 2, 3], f'{tag} snapshots out of order'
            assert [s.messages for s in mine] == [conversation(step, tag=tag) for step in range(4)]

    async def test_concurrent_registration_of_one_run_id(self, store: StepStore) -> None:
        run_id = new_id('run')
        outcomes: list[str] = []

        async def registrar(n: int) -> None:
            try:
                await store.register_run(RunRecord(run_id=run_id, registration_id=f'reg-{n}', started_at=at(n)))
            except ValueError:
                outcomes.append('refused')
            else:
                outcomes.append(f'reg-{n}')

        async with anyio.create_task_group() as tg:
            for n in range(10):
                tg.start_soon(registrar, n)
        winners = [o for o in outcomes if o != 'refused']
        assert len(winners) == 1, f'{len(winners)} registrations of one run id succeeded: {winners}'
        stored = await store.get_run(run_id=run_id)
        assert stored is not None
        assert stored.registration_id == winners[0]

    async def test_concurrent_replays_of_one_idempotency_key(self, store: StepStore) -> None:
        run_id = await register(store)

        async def replay(n: int) -> None:
            await store.append_event(event(run_id, n, idempotency_key='once'))
            await store.save_snapshot(snapshot(run_id, conversation(n), step_index=n, idempotency_key='once'))

        async with anyio.create_task_group() as tg:
            for n in range(10):
                tg.start_soon(replay, n)
        assert len(await store.list_events(run_id=run_id)) == 1
        listed = await store.list_snapshots(run_id=run_id)
        assert len(listed) == 1
        assert listed[0].messages == conversation(listed[0].step_index)

    async def test_concurrent_tool_effect_writers(self, store: StepStore) -> None:
        run_id = await register(store)

        async def tool(n: int) -> None:
            await store.record_tool_effect(effect(run_id, f'call-{n:02d}', started=n))
            await store.record_tool_effect(effect(run_id, f'call-{n:02d}', ToolEffectStatus.COMPLETED, started=n))

        async with anyio.create_task_group() as tg:
            for n in range(WRITERS):
                tg.start_soon(tool, n)
        listed = await store.list_tool_effects(run_id=run_id)
        assert [r.tool_call_id for r in listed] == [f'call-{n:02d}' for n in range(WRITERS)]
        assert {r.status for r in listed} == {ToolEffectStatus.COMPLETED}
        assert await store.list_unresolved_tool_effects(run_id=run_id) == []

    @needs_feature(PERSISTENT)
    async def test_writers_in_other_processes(self, store: StepStore, store_spec: dict[str, Any] | None) -> None:
        assert store_spec is not None  # the feature gate fails a persistent store without one
        run_id = await register(store)
        children = ['child-a', 'child-b']
        results: dict[str, tuple[int, str]] = {}

        async def child(tag: str) -> None:
            job = {'spec': store_spec, 'run_id': run_id, 'tag': tag, 'events': 30, 'snapshots': 4}
            done = await anyio.run_process(
                [sys.executable, '-m', 'stepcore_conformance._worker', json.dumps(job)], check=False
            )
            results[tag] = (done.returncode, done.stderr.decode(errors='replace'))

        async def parent() -> None:
            for n in range(4):
                await store.save_snapshot(
                    snapshot(run_id, conversation(n, tag='parent'), step_index=n, metadata={'writer': 'parent'})
                )
            for n in range(30):
                await store.append_event(event(run_id, n, metadata={'writer': 'parent', 'i': str(n)}))

        # A guard against a writer stuck on a lock, not a performance bound.
        with anyio.fail_after(HANG_GUARD_SECONDS):
            async with anyio.create_task_group() as tg:
                for tag in children:
                    tg.start_soon(child, tag)
                tg.start_soon(parent)
        assert sorted(results) == children
        for tag, (code, stderr) in results.items():
            assert code == 0, f'writer process {tag} failed:\n{stderr}'
        writers = ['parent', *children]
        _check_trail(await store.list_events(run_id=run_id), writers, 30)
        listed = await store.list_snapshots(run_id=run_id)
        assert len({s.seq for s in listed}) == len(listed) == 12
        for tag in writers:
            mine = [s for s in listed if s.metadata['writer'] == tag]
            assert [s.messages for s in mine] == [conversation(n, tag=tag) for n in range(4)]
