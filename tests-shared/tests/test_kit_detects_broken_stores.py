"""The kit fails stores that break a guarantee or claim what they do not do, and says what to do when misused.

Each store below lies in one way; its test class runs the kit sections that must catch it, through
pytester, and the report's verdicts are checked too.
"""

from pathlib import Path

import pytest

pytest_plugins = ['pytester']

INI = '[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n'
OPT_IN = "pytest_plugins = ['stepcore_conformance']\n"

BROKEN_STORES = """
import logging
from typing import ClassVar

import pytest

from memory_hook import damage_memory
from stepcore import DamagedRecordError, InMemoryStepStore, StepStore
from stepcore.backend import (
    MEDIA_EXTERNALIZATION,
    PERSISTENT,
    SNAPSHOT_RETENTION,
    check_max_snapshots,
    require_feature,
)
from stepcore_conformance import (
    BatchWritesConformance,
    CapabilityConformance,
    ConcurrencyConformance,
    CrashWindowConformance,
    DamageConformance,
    DeleteConformance,
    EventsConformance,
    FeaturesConformance,
    MediaExternalizationConformance,
    PersistenceConformance,
    RetentionConformance,
    RunsConformance,
    SnapshotsConformance,
)


class IgnoresEventKeys(InMemoryStepStore):
    async def append_event(self, event):
        await super().append_event(event.model_copy(update={'idempotency_key': None}))


class RunsInInsertionOrder(InMemoryStepStore):
    async def list_runs(self, *, conversation_id=None, parent_run_id=None):
        found = {
            r.run_id: r
            for r in await super().list_runs(conversation_id=conversation_id, parent_run_id=parent_run_id)
        }
        return [found[run_id] for run_id in self.port._runs if run_id in found]  # as registered, whatever their start


class AcceptsRetentionSilently(InMemoryStepStore):
    features: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, *, max_snapshots_per_run=None):
        super().__init__()
        check_max_snapshots(max_snapshots_per_run)  # validated, then ignored


class RefusesRetention(InMemoryStepStore):
    features: ClassVar[frozenset[str]] = frozenset({SNAPSHOT_RETENTION})

    def __init__(self, *, max_snapshots_per_run=None, **options):
        if max_snapshots_per_run is not None:
            raise NotImplementedError('pruning is not written yet')
        super().__init__(**options)


class ClaimsPersistence(InMemoryStepStore):
    features: ClassVar[frozenset[str]] = frozenset({SNAPSHOT_RETENTION, PERSISTENT})


class IgnoresMediaStore(InMemoryStepStore):
    features: ClassVar[frozenset[str]] = frozenset({SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION})

    def __init__(self, *, media_store=None, media_threshold_bytes=None, **options):
        super().__init__(**options)  # payloads stay inline


class RefusesAuto(InMemoryStepStore):
    def __init__(self, *, media_store=None, **options):
        if media_store is not None:  # 'auto' taken for a media store of the caller's
            require_feature(self, MEDIA_EXTERNALIZATION, option='media_store')
        super().__init__(**options)


class CompletedBeforeSnapshot(InMemoryStepStore):
    async def write_batch(self, writes, *, snapshot=None):
        await super().write_batch(writes)  # the ledger entries first, in a write of their own
        if snapshot is not None:
            await super().write_batch([], snapshot=snapshot)


class HidesDamage(InMemoryStepStore):
    async def get_run(self, run_id):
        try:
            return await super().get_run(run_id)
        except DamagedRecordError:
            return None

    async def latest_snapshot(self, run_id, *, include_interrupted=False):
        try:
            return await super().latest_snapshot(run_id, include_interrupted=include_interrupted)
        except DamagedRecordError:
            return None

    async def list_tool_effects(self, run_id):
        try:
            return await super().list_tool_effects(run_id)
        except DamagedRecordError:
            return []

    async def list_unresolved_tool_effects(self, run_id):
        try:
            return await super().list_unresolved_tool_effects(run_id)
        except DamagedRecordError:
            return []

    async def list_events(self, run_id):
        logger = logging.getLogger('stepcore.engine')
        logger.disabled = True  # skipped without a word
        try:
            return await super().list_events(run_id)
        finally:
            logger.disabled = False


class NoDelete(StepStore):
    def __init__(self, **options):
        self.inner = InMemoryStepStore(**options)

    async def register_run(self, record):
        await self.inner.register_run(record)

    async def get_run(self, run_id):
        return await self.inner.get_run(run_id)

    async def list_runs(self, *, conversation_id=None, parent_run_id=None):
        return await self.inner.list_runs(conversation_id=conversation_id, parent_run_id=parent_run_id)

    async def append_event(self, event):
        await self.inner.append_event(event)

    async def list_events(self, run_id):
        return await self.inner.list_events(run_id)

    async def save_snapshot(self, snapshot):
        await self.inner.save_snapshot(snapshot)

    async def list_snapshots(self, run_id, *, include_interrupted=False):
        return await self.inner.list_snapshots(run_id, include_interrupted=include_interrupted)

    async def record_tool_effect(self, record):
        await self.inner.record_tool_effect(record)

    async def list_tool_effects(self, run_id):
        return await self.inner.list_tool_effects(run_id)


class ListsInterruptedByDefault(InMemoryStepStore):
    async def list_snapshots(self, run_id, *, include_interrupted=False):
        return await super().list_snapshots(run_id, include_interrupted=True)


class BatchesOutOfOrder(InMemoryStepStore):
    async def write_batch(self, writes, *, snapshot=None):
        await super().write_batch(list(reversed(writes)), snapshot=snapshot)


class Built:
    store_class = InMemoryStepStore

    @pytest.fixture
    async def store(self, store_options):
        yield self.store_class(**store_options)


class TestIgnoresEventKeys(Built, EventsConformance):
    store_class = IgnoresEventKeys


class TestRunsInInsertionOrder(Built, RunsConformance):
    store_class = RunsInInsertionOrder


class TestAcceptsRetentionSilently(Built, FeaturesConformance, RetentionConformance):
    store_class = AcceptsRetentionSilently


class TestRefusesRetention(Built, FeaturesConformance, RetentionConformance):
    store_class = RefusesRetention


class TestClaimsPersistence(
    Built, PersistenceConformance, ConcurrencyConformance, DeleteConformance, DamageConformance, CapabilityConformance
):
    store_class = ClaimsPersistence


class TestIgnoresMediaStore(Built, MediaExternalizationConformance):
    store_class = IgnoresMediaStore


class TestRefusesAuto(Built, MediaExternalizationConformance):
    store_class = RefusesAuto


class TestCompletedBeforeSnapshot(Built, BatchWritesConformance, CrashWindowConformance):
    store_class = CompletedBeforeSnapshot


class TestHidesDamage(Built, DamageConformance):
    store_class = HidesDamage

    @pytest.fixture
    def damage(self):
        return damage_memory


class TestNoDelete(Built, DeleteConformance):
    store_class = NoDelete


class TestListsInterruptedByDefault(Built, SnapshotsConformance):
    store_class = ListsInterruptedByDefault


class TestBatchesOutOfOrder(Built, BatchWritesConformance):
    store_class = BatchesOutOfOrder


class TestForgotTheFixture(RunsConformance):
    pass
"""


def test_lying_stores_fail_and_the_report_says_so(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)
    pytester.makeconftest(OPT_IN)
    # The in-memory store's damage hook, as the kit's own test of that store defines it.
    pytester.makepyfile(memory_hook=Path(__file__).with_name('test_memory.py').read_text())  # pyright: ignore[reportUnknownMemberType]
    pytester.makepyfile(test_broken=BROKEN_STORES)  # pyright: ignore[reportUnknownMemberType]
    outcome = pytester.runpytest_inprocess('-rfEs', '-p', 'no:cacheprovider')
    _broken_guarantees_fail(outcome)
    _undeclared_options_accepted_silently_fail(outcome)
    _a_declared_feature_whose_options_are_refused_fails(outcome)
    _persistent_without_store_spec_fails(outcome)
    _media_options_taken_but_ignored_fail(outcome)
    _completed_entry_before_its_snapshot_fails_the_crash_window(outcome)
    _hidden_damage_fails(outcome)
    _a_store_missing_delete_run_cannot_be_built(outcome)
    assert 'write_batch:' not in outcome.stdout.str(), 'every store has write_batch: it is not an optional feature'


def _broken_guarantees_fail(outcome: pytest.RunResult) -> None:
    lines = outcome.stdout.fnmatch_lines
    # A store ignoring event idempotency keys, and one listing runs out of order, fail.
    lines(['FAILED*TestIgnoresEventKeys::test_applied_event_key_is_suppressed*'])
    lines(['FAILED*TestRunsInInsertionOrder::test_list_runs_orders_by_started_at_ascending*'])
    # A batch applied out of order fails the batch section (every store has write_batch).
    lines(['FAILED*TestBatchesOutOfOrder::test_events_keep_order_and_seq_after_single_appends*'])
    # A store listing interrupted snapshots without being asked fails the snapshot section.
    lines(['FAILED*TestListsInterruptedByDefault::test_list_snapshots_gives_complete_ones_unless_asked*'])
    # A subclass without a `store` fixture is told what to write.
    lines(['*TestForgotTheFixture must override the `store` fixture*'])


def _undeclared_options_accepted_silently_fail(outcome: pytest.RunResult) -> None:
    lines = outcome.stdout.fnmatch_lines
    lines(['*AcceptsRetentionSilently accepted max_snapshots_per_run without declaring feature*'])
    lines(['FAILED*TestAcceptsRetentionSilently::test_undeclared_snapshot_retention_is_refused*'])
    # Its retention tests are skipped with a reason, and the verdict says the feature is not declared.
    lines(["SKIPPED*AcceptsRetentionSilently does not declare feature 'snapshot_retention'*"])
    lines(['*TestAcceptsRetentionSilently*', '*features: snapshot_retention: not declared*'])


def _a_declared_feature_whose_options_are_refused_fails(outcome: pytest.RunResult) -> None:
    lines = outcome.stdout.fnmatch_lines
    lines(['ERROR*TestRefusesRetention::test_keeps_the_newest_n*'])
    lines(["*RefusesRetention declares feature 'snapshot_retention' but refused its options*"])
    lines(['FAILED*TestRefusesRetention::test_undeclared_snapshot_retention_is_refused*'])
    lines(['*TestRefusesRetention*', '*features: snapshot_retention: FAILED (* failed: *'])
    assert 'TestRefusesRetention::test_keeps_the_newest_n' not in _skipped(outcome)


def _persistent_without_store_spec_fails(outcome: pytest.RunResult) -> None:
    lines = outcome.stdout.fnmatch_lines
    for test in (
        'test_a_new_store_reads_everything',
        'test_history_continued_by_another_store',
        'test_writers_in_other_processes',
        'test_another_store_no_longer_sees_a_deleted_run',
        'test_killed_process_leaves_unresolved_effect_and_settled_snapshot',
    ):
        lines([f'ERROR*TestClaimsPersistence::{test}*'])
    lines(["*ClaimsPersistence declares feature 'persistent' but TestClaimsPersistence has no store_spec fixture*"])
    lines(['*override store_spec*'])
    # Nor has it a damage hook, which a persistent store needs.
    lines(['FAILED*TestClaimsPersistence::test_damaged_run_record*'])
    lines(["*ClaimsPersistence declares feature 'persistent' but TestClaimsPersistence has no damage fixture*"])
    lines(['*TestClaimsPersistence*', '*persistent: FAILED (6 failed: *'])


def _media_options_taken_but_ignored_fail(outcome: pytest.RunResult) -> None:
    lines = outcome.stdout.fnmatch_lines
    lines(['FAILED*TestIgnoresMediaStore::test_payloads_are_stored_in_the_media_store*'])
    lines(['*TestIgnoresMediaStore*', '*features: *media_externalization: FAILED (*failed: *'])
    # 'auto' must reach the store's default media store, and a bogus media_store must be refused.
    lines(['FAILED*TestIgnoresMediaStore::test_media_store_auto_externalizes_to_the_default_media_store*'])
    lines(["*IgnoresMediaStore declares feature 'media_externalization' but, built with media_store='auto'*"])
    lines(["FAILED*TestIgnoresMediaStore::test_a_bogus_media_store_is_refused*media_store='disk'*"])
    lines(["*media_store='disk' was accepted; it must raise TypeError or ValueError*"])
    # A store without the feature still takes 'auto', its default: refusing it is an error, not a skip.
    lines(['ERROR*TestRefusesAuto::test_media_store_auto_is_every_stores_default*'])
    lines(["*the store refused media_store='auto'*"])
    assert 'TestRefusesAuto::test_media_store_auto_is_every_stores_default' not in _skipped(outcome)


def _completed_entry_before_its_snapshot_fails_the_crash_window(outcome: pytest.RunResult) -> None:
    lines = outcome.stdout.fnmatch_lines
    lines(['FAILED*TestCompletedBeforeSnapshot::test_a_write_stopped_at_any_boundary_keeps_the_crash_rule*'])
    lines(["*tool call 'call-1' is recorded completed but its result is not in the latest complete snapshot*"])
    # Only the crash window sees it: what is stored in the end is the same.
    lines(['*TestCompletedBeforeSnapshot*', '*batches 9 passed; crash_window 1 failed/1 skipped*'])


def _hidden_damage_fails(outcome: pytest.RunResult) -> None:
    for test in (
        'test_damaged_run_record',
        'test_damaged_event',
        'test_damaged_ledger_entry',
        'test_damaged_snapshot_header',
        'test_damaged_message',
    ):
        outcome.stdout.fnmatch_lines([f'FAILED*TestHidesDamage::{test}*'])
    outcome.stdout.fnmatch_lines(['*list_events skipped 1 damaged record(s) of * but logged 0 warning(s)*'])


def _a_store_missing_delete_run_cannot_be_built(outcome: pytest.RunResult) -> None:
    lines = outcome.stdout.fnmatch_lines
    lines(['FAILED*TestNoDelete::test_delete_removes_the_run_and_nothing_else*'])
    lines(['*NoDelete does not implement delete_run*'])


def _skipped(outcome: pytest.RunResult) -> str:
    return '\n'.join(line for line in outcome.stdout.lines if line.startswith('SKIPPED'))
