"""`delete_conversation` and `prune`: whole runs removed by conversation, by delegation and by age."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest

from stepcore import EventKind, RunRecord, StepStore, ToolEffectStatus
from stepcore.backend import utcnow

from ._support import StoreFixtures, conversation, event, new_id, register, snapshot
from .effects import effect

__all__ = ('DeleteConversationConformance', 'PruneConformance')


async def _ids(store: StepStore, **filters: Any) -> list[str]:
    return [r.run_id for r in await store.list_runs(**filters)]


async def _gone(store: StepStore, run_id: str) -> bool:
    return (
        await store.get_run(run_id=run_id) is None
        and await store.list_events(run_id=run_id) == []
        and await store.list_tool_effects(run_id=run_id) == []
        and await store.list_snapshots(run_id=run_id, include_interrupted=True) == []
    )


class DeleteConversationConformance(StoreFixtures):
    """`delete_conversation` removes a conversation's runs, and with `include_delegates` their delegates."""

    async def test_removes_every_run_of_the_conversation_and_nothing_else(self, store: StepStore) -> None:
        doomed, kept = new_id('conv'), new_id('conv')
        runs = [await register(store, conversation_id=doomed) for _ in range(3)]
        await store.append_event(event(runs[0], 0))
        other = await register(store, conversation_id=kept)
        delegate = await register(store, parent_run_id=runs[1])
        assert await store.delete_conversation(doomed) == 3
        for run_id in runs:
            assert await _gone(store, run_id), f'{run_id!r} outlived delete_conversation'
        assert await _ids(store, conversation_id=doomed) == []
        assert await _ids(store, conversation_id=kept) == [other]
        assert await store.get_run(run_id=delegate) is not None, 'a delegate went without include_delegates=True'
        assert await store.delete_conversation(doomed) == 0

    async def test_include_delegates_follows_the_parent_chain(self, store: StepStore) -> None:
        conversation_id = new_id('conv')
        root = await register(store, conversation_id=conversation_id)
        child = await register(store, parent_run_id=root)  # no conversation of its own
        grandchild = await register(store, parent_run_id=child, conversation_id=new_id('elsewhere'))
        unrelated_parent = await register(store)
        unrelated = await register(store, parent_run_id=unrelated_parent)
        assert await store.delete_conversation(conversation_id, include_delegates=True) == 3
        for run_id in (root, child, grandchild):
            assert await _gone(store, run_id), f'{run_id!r} outlived delete_conversation(include_delegates=True)'
        assert await store.get_run(run_id=unrelated) is not None
        assert await store.get_run(run_id=unrelated_parent) is not None

    async def test_an_unknown_conversation_removes_nothing(self, store: StepStore) -> None:
        run_id = await register(store, conversation_id=new_id('conv'))
        assert await store.delete_conversation(new_id('never')) == 0
        assert await store.get_run(run_id=run_id) is not None

    @pytest.mark.parametrize('bad', ['', None, 42])
    async def test_a_bad_conversation_id_is_refused(self, store: StepStore, bad: Any) -> None:
        run_id = await register(store, conversation_id=new_id('conv'))
        with pytest.raises(ValueError, match=f'conversation_id {bad!r}'):
            await store.delete_conversation(bad)
        assert await store.get_run(run_id=run_id) is not None


def _ago(days: float) -> datetime:
    return utcnow() - timedelta(days=days)


async def _old_run(store: StepStore, conversation_id: str, *, days: float = 40) -> str:
    """A run started and last written `days` ago: 2 events, 2 ledger entries, 2 snapshots."""
    run_id = await register(store, conversation_id=conversation_id, started_at=_ago(days))
    for n, kind in enumerate((EventKind.RUN_STARTED, EventKind.RUN_COMPLETED)):
        await store.append_event(event(run_id, n, kind=kind, timestamp=_ago(days)))
    for call in ('c1', 'c2'):
        await store.record_tool_effect(effect(run_id, call, ToolEffectStatus.COMPLETED, updated_at=_ago(days)))
    for step in (1, 2):
        await store.save_snapshot(snapshot(run_id, conversation(step), step_index=step, timestamp=_ago(days)))
    return run_id


class PruneConformance(StoreFixtures):
    """`prune` removes runs idle for longer than asked, never one still being written."""

    async def test_prunes_idle_runs_and_reports_what_went(self, store: StepStore) -> None:
        conversation_id = new_id('conv')
        old = [await _old_run(store, conversation_id) for _ in range(2)]
        recent = await register(store, conversation_id=conversation_id, started_at=_ago(1))
        report = await store.prune(timedelta(days=30), conversation_id=conversation_id)
        assert report.runs == old
        assert (report.snapshots, report.events, report.ledger_entries) == (4, 4, 4)
        assert report.dry_run is False
        assert report.kept_active == []
        for run_id in old:
            assert await _gone(store, run_id), f'{run_id!r} outlived prune'
        assert await _ids(store, conversation_id=conversation_id) == [recent]

    async def test_a_run_written_after_the_cutoff_is_kept(self, store: StepStore) -> None:
        """Age counts from a run's last activity: a run started 40 days ago that wrote yesterday stays."""
        conversation_id = new_id('conv')
        by_event = await _old_run(store, conversation_id)
        await store.append_event(event(by_event, 9, kind=EventKind.MODEL_REQUEST_STARTED, timestamp=_ago(1)))
        by_ledger = await _old_run(store, conversation_id)
        await store.record_tool_effect(effect(by_ledger, 'c9', updated_at=_ago(1)))
        by_snapshot = await _old_run(store, conversation_id)
        await store.save_snapshot(snapshot(by_snapshot, conversation(3), step_index=3, timestamp=_ago(1)))
        idle = await _old_run(store, conversation_id)
        report = await store.prune(timedelta(days=30), conversation_id=conversation_id)
        assert report.runs == [idle]
        assert report.kept_active == [by_event, by_ledger, by_snapshot]
        assert await _ids(store, conversation_id=conversation_id) == [by_event, by_ledger, by_snapshot]
        assert len(await store.list_events(run_id=by_event)) == 3

    async def test_dry_run_reports_the_same_and_removes_nothing(self, store: StepStore) -> None:
        conversation_id = new_id('conv')
        old = await _old_run(store, conversation_id)
        calls: list[tuple[int, int]] = []
        report = await store.prune(
            timedelta(days=30),
            conversation_id=conversation_id,
            dry_run=True,
            progress=lambda done, total: calls.append((done, total)),
        )
        assert report.dry_run is True
        assert report.runs == [old]
        assert (report.snapshots, report.events, report.ledger_entries) == (2, 2, 2)
        assert calls == [(0, 1), (1, 1)]
        assert await store.get_run(run_id=old) is not None
        assert len(await store.list_snapshots(run_id=old)) == 2
        assert (await store.prune(timedelta(days=30), conversation_id=conversation_id)).runs == [old]

    async def test_only_the_given_conversation_is_pruned(self, store: StepStore) -> None:
        mine, theirs = new_id('conv'), new_id('conv')
        doomed = await _old_run(store, mine)
        kept = await _old_run(store, theirs)
        assert (await store.prune(timedelta(days=30), conversation_id=mine)).runs == [doomed]
        assert await store.get_run(run_id=kept) is not None
        dry = await store.prune(timedelta(days=30), dry_run=True)
        assert kept in dry.runs
        assert doomed not in dry.runs

    async def test_the_age_is_compared_with_the_cutoff(self, store: StepStore) -> None:
        conversation_id = new_id('conv')
        old = await _old_run(store, conversation_id, days=10)
        assert (await store.prune(timedelta(days=30), conversation_id=conversation_id)).runs == []
        assert (await store.prune(timedelta(days=5), conversation_id=conversation_id)).runs == [old]

    @pytest.mark.parametrize('bad', [timedelta(0), timedelta(days=-1), 30, '30d', None])
    async def test_a_bad_age_is_refused(self, store: StepStore, bad: Any) -> None:
        conversation_id = new_id('conv')
        old = await _old_run(store, conversation_id)
        with pytest.raises(ValueError, match=re.escape(f'older_than {bad!r}')):
            await store.prune(bad, conversation_id=conversation_id)
        assert await store.get_run(run_id=old) is not None

    async def test_a_run_record_with_no_other_records_is_pruned_by_its_start(self, store: StepStore) -> None:
        conversation_id = new_id('conv')
        bare = RunRecord(run_id=new_id('bare'), conversation_id=conversation_id, started_at=_ago(40))
        await store.register_run(bare)
        report = await store.prune(timedelta(days=30), conversation_id=conversation_id)
        assert report.runs == [bare.run_id]
        assert (report.snapshots, report.events, report.ledger_entries) == (0, 0, 0)
