"""The kit fails stores that break a guarantee, and says what to do when misused."""

import pytest

pytest_plugins = ['pytester']

BROKEN_STORES = """
import pytest
from typing import ClassVar

from stepcore import InMemoryStepStore
from stepcore.retention import check_max_snapshots
from stepcore_conformance import StepStoreConformance


class IgnoresEventKeys(InMemoryStepStore):
    async def append_event(self, event):
        await super().append_event(event.model_copy(update={'idempotency_key': None}))


class RunsInInsertionOrder(InMemoryStepStore):
    async def list_runs(self, *, conversation_id=None, parent_run_id=None):
        return [
            r.model_copy(deep=True)
            for r in self._runs_by_id.values()
            if (conversation_id is None or r.conversation_id == conversation_id)
            and (parent_run_id is None or r.parent_run_id == parent_run_id)
        ]


class AcceptsRetentionSilently(InMemoryStepStore):
    features: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, *, max_snapshots_per_run=None):
        super().__init__()
        check_max_snapshots(max_snapshots_per_run)  # validated, then ignored


class TestIgnoresEventKeys(StepStoreConformance):
    @pytest.fixture
    async def store(self, store_options):
        yield IgnoresEventKeys(**store_options)


class TestRunsInInsertionOrder(StepStoreConformance):
    @pytest.fixture
    async def store(self, store_options):
        yield RunsInInsertionOrder(**store_options)


class TestAcceptsRetentionSilently(StepStoreConformance):
    @pytest.fixture
    async def store(self, store_options):
        yield AcceptsRetentionSilently(**store_options)


class TestForgotTheFixture(StepStoreConformance):
    pass
"""

SELECTED = [
    'test_applied_event_key_is_suppressed',
    'test_list_runs_orders_by_started_at_ascending',
    'test_undeclared_snapshot_retention_is_refused',
    'test_keeps_the_newest_n',
    'test_get_run_of_unknown_id_is_none',
]


def test_broken_stores_fail_and_the_report_says_so(pytester: pytest.Pytester) -> None:
    pytester.makeini('[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n')
    pytester.makepyfile(test_broken=BROKEN_STORES)
    outcome = pytester.runpytest_inprocess('-rfEs', '-k', ' or '.join(SELECTED), '-p', 'no:cacheprovider')
    lines = outcome.stdout.fnmatch_lines
    # A store ignoring event idempotency keys, and one listing runs out of order, fail.
    lines(['FAILED*TestIgnoresEventKeys::test_applied_event_key_is_suppressed*'])
    lines(['FAILED*TestRunsInInsertionOrder::test_list_runs_orders_by_started_at_ascending*'])
    # A store accepting an option of an undeclared feature fails; its retention tests are skipped
    # with a reason instead of passing.
    lines(['*AcceptsRetentionSilently accepted max_snapshots_per_run without declaring feature*'])
    lines(['FAILED*TestAcceptsRetentionSilently::test_undeclared_snapshot_retention_is_refused*'])
    lines(["SKIPPED*AcceptsRetentionSilently does not declare feature 'snapshot_retention'*"])
    # A subclass without a `store` fixture is told what to write.
    lines(['*TestForgotTheFixture must override the `store` fixture*'])
    # The closing report gives the feature verdicts.
    lines(['*stepcore conformance*', '*TestAcceptsRetentionSilently*', '*features: snapshot_retention: skipped*'])
    outcome.assert_outcomes(passed=9, failed=4, skipped=3, errors=4)


BATCHING_STORES = """
import pytest

from stepcore import InMemoryStepStore
from stepcore_conformance import BatchWritesConformance


class WithoutBatches(InMemoryStepStore):
    write_batch = None


class BatchesOutOfOrder(InMemoryStepStore):
    async def write_batch(self, writes, *, snapshot=None):
        await super().write_batch(list(reversed(writes)), snapshot=snapshot)


class TestWithoutBatches(BatchWritesConformance):
    @pytest.fixture
    async def store(self, store_options):
        yield WithoutBatches(**store_options)


class TestBatchesOutOfOrder(BatchWritesConformance):
    @pytest.fixture
    async def store(self, store_options):
        yield BatchesOutOfOrder(**store_options)


class TestInMemory(BatchWritesConformance):
    @pytest.fixture
    async def store(self, store_options):
        yield InMemoryStepStore(**store_options)
"""


def test_write_batch_verdicts(pytester: pytest.Pytester) -> None:
    pytester.makeini('[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n')
    pytester.makepyfile(test_batches=BATCHING_STORES)
    outcome = pytester.runpytest_inprocess('-rfs', '-p', 'no:cacheprovider')
    lines = outcome.stdout.fnmatch_lines
    lines(['SKIPPED*WithoutBatches has no write_batch: StepPersistence makes one store call per write instead*'])
    lines(['FAILED*TestBatchesOutOfOrder::test_events_keep_order_and_seq_after_single_appends*'])
    lines(['*TestWithoutBatches*', '*features: write_batch: skipped (not implemented)*'])
    lines(['*TestBatchesOutOfOrder*', '*features: write_batch: FAILED*'])
    lines(['*TestInMemory*', '*features: write_batch: passed*'])
