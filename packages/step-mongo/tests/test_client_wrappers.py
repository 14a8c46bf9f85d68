"""`client=` takes any client with pymongo's async API, not only an `AsyncMongoClient`.

The wrappers below are not `AsyncMongoClient` subclasses. They delegate to a real client talking
to the server at STEP_MONGO_URL, the way a tracing proxy or another driver's client would: one
forwards every attribute (so the store finds `get_database`), the other offers only `client[name]`.
The stores' own sections of the conformance kit then run through them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, UserPromptPart
from pymongo import MongoClient as SyncMongoClient

from step_mongo import MongoMediaStore, MongoStepStore
from step_mongo.client import MongoClient
from stepcore import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.store.codec import encode_messages
from stepcore_conformance import (
    EffectsConformance,
    EventsConformance,
    MediaExternalizationConformance,
    RunsConformance,
    SnapshotsConformance,
)


class Delegating:
    """Forwards every attribute and `[]` to the client it wraps."""

    def __init__(self, client: MongoClient) -> None:
        self._wrapped = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)

    def __getitem__(self, name: str) -> Any:
        return self._wrapped[name]


class SubscriptOnly:
    """Hands out databases by `client[name]` and nothing else."""

    def __init__(self, client: MongoClient) -> None:
        self._wrapped = client

    def __getitem__(self, name: str) -> Any:
        return self._wrapped[name]


WRAPPERS = [Delegating, SubscriptOnly]


class _ThroughAWrapper:
    wrapper: type[Delegating] | type[SubscriptOnly]

    @pytest.fixture
    async def store(
        self, mongo_client: MongoClient, db_name: str, store_options: dict[str, Any]
    ) -> AsyncIterator[MongoStepStore]:
        wrapped = self.wrapper(mongo_client)
        store = MongoStepStore(client=wrapped, database=db_name, **store_options)
        yield store
        await store.aclose()


class TestThroughADelegatingProxy(
    _ThroughAWrapper,
    RunsConformance,
    EventsConformance,
    SnapshotsConformance,
    EffectsConformance,
    MediaExternalizationConformance,
):
    wrapper = Delegating


class TestThroughASubscriptOnlyClient(
    _ThroughAWrapper,
    RunsConformance,
    EventsConformance,
    SnapshotsConformance,
    EffectsConformance,
    MediaExternalizationConformance,
):
    wrapper = SubscriptOnly


@pytest.mark.parametrize('wrapper', WRAPPERS, ids=lambda w: w.__name__)
async def test_a_wrapped_client_serves_a_run_and_its_media(
    wrapper: type[Delegating] | type[SubscriptOnly], mongo_client: MongoClient, db_name: str
) -> None:
    wrapped = wrapper(mongo_client)
    store = MongoStepStore(client=wrapped, database=db_name)
    assert store.client is wrapped
    assert isinstance(store.media_store, MongoMediaStore)
    assert store.media_store.client is wrapped
    assert store.database_name == db_name
    image = bytes(range(256)) * 260  # over the 64 KiB threshold: goes to the media collections
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(['look', BinaryContent(data=image, media_type='image/png')])])
    ]
    record = RunRecord(run_id='r1', conversation_id='c1')
    await store.register_run(record)
    snapshot = ContinuableSnapshot(run_id='r1', messages=messages, state=SnapshotState.COMPLETE, step_index=0)
    effect = ToolEffectRecord(run_id='r1', tool_call_id='t1', tool_name='look', status=ToolEffectStatus.STARTED)
    started = StepEvent(run_id='r1', kind=EventKind.TOOL_CALL_STARTED, step_index=0)
    await store.write_batch([effect, started], snapshot=snapshot)
    await store.aclose()  # a given client stays open, wrapped or not

    reader = MongoStepStore(client=wrapper(mongo_client), database=db_name)
    assert await reader.get_run('r1') == record  # datetimes come back aware, to the microsecond
    assert await reader.list_events('r1') == [started]
    assert await reader.list_unresolved_tool_effects('r1') == [effect]
    latest = await reader.latest_snapshot('r1')
    assert latest is not None
    # pydantic-ai reads image bytes back as BinaryImage: compare the encoded messages.
    assert encode_messages(latest.messages) == encode_messages(messages)
    assert latest.model_copy(update={'messages': messages}) == snapshot
    assert await mongo_client[db_name]['media'].count_documents({}) == 1


def test_a_synchronous_client_is_refused_with_what_to_pass(mongo_url: str) -> None:
    client: SyncMongoClient[Any] = SyncMongoClient(mongo_url, connect=False)
    try:
        with pytest.raises(TypeError, match=r'synchronous pymongo\.MongoClient .* pass a pymongo\.AsyncMongoClient'):
            MongoStepStore(client=client)  # pyright: ignore[reportArgumentType]
    finally:
        client.close()


def test_a_connection_string_given_as_client_is_refused_with_what_to_pass() -> None:
    with pytest.raises(TypeError, match='got a str as client=: pass a connection string as db_url='):
        MongoStepStore(client='mongodb://127.0.0.1:27017')  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize('client', [object(), 42, [1, 2]], ids=['object', 'int', 'list'])
def test_something_that_is_no_client_is_refused(client: object) -> None:
    with pytest.raises(TypeError, match=rf'needs an async MongoDB client as client=, got {type(client).__name__}'):
        MongoStepStore(client=client)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match='needs an async MongoDB client'):
        MongoMediaStore(client=client)  # pyright: ignore[reportArgumentType]
