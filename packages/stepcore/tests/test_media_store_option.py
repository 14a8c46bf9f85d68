"""`media_store=`: `'auto'` (every step store's default), `None`, or a media store; nothing else."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, UserPromptPart

import stepcore
from stepcore import ContinuableSnapshot, InMemoryStepStore, RunRecord
from stepcore.engine import EngineStore
from stepcore.engine.memory import MemoryPort
from stepcore.media import (
    AUTO,
    EMPTY_CONTEXT,
    MediaContext,
    MediaStore,
    check_media_store,
    media_uri,
    resolve_media_store,
)
from stepcore_conformance import InMemoryMediaStore

T = datetime(2026, 1, 1, tzinfo=UTC)
LARGE = bytes(range(256)) * 300  # 75 KiB: over the default threshold


class ReferenceShapedMediaStore:
    """A user's own media store written to the five methods, not deriving from `MediaStore`."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        uri = media_uri(data)
        self.blobs[uri] = data
        return uri

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        return self.blobs[uri]

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        return uri in self.blobs

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        return None

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str] | None:
        return None


class Sentinel:
    """What a default factory returns, to see when it was called."""


def _default() -> Any:
    return Sentinel()


def test_auto_is_the_default_and_nothing_else_calls_it() -> None:
    calls: list[int] = []

    def default() -> MediaStore | None:
        calls.append(1)
        return None

    assert resolve_media_store('auto', default=_default, owner='S').__class__ is Sentinel
    assert resolve_media_store(None, default=default, owner='S') is None
    given = InMemoryMediaStore()
    assert resolve_media_store(given, default=default, owner='S') is given
    assert not calls
    assert AUTO == 'auto'


def test_any_object_with_the_five_methods_is_a_media_store() -> None:
    mine = ReferenceShapedMediaStore()
    assert resolve_media_store(mine, default=_default, owner='S') is mine
    assert check_media_store(mine, owner='S') is mine


@pytest.mark.parametrize(
    ('bad', 'error', 'why'),
    [
        ('disk', ValueError, "the only string it takes is 'auto'"),
        ('AUTO', ValueError, "the only string it takes is 'auto'"),
        ('', ValueError, "the only string it takes is 'auto'"),
        (42, TypeError, 'int has no put, get, exists, public_url, get_metadata'),
        ({'kind': 'disk'}, TypeError, 'dict has no put, exists, public_url, get_metadata'),
        (True, TypeError, 'bool has no put'),
        (InMemoryMediaStore, TypeError, 'is a class, not a media store: pass an instance of it'),
    ],
    ids=['disk', 'AUTO', 'empty', 'int', 'dict', 'bool', 'class'],
)
def test_anything_else_is_refused_naming_the_option_the_value_and_the_choices(
    bad: object, error: type[Exception], why: str
) -> None:
    called: list[int] = []

    def default() -> MediaStore | None:
        called.append(1)
        return None

    with pytest.raises(error) as raised:
        resolve_media_store(bad, default=default, owner='SomeStepStore')
    message = str(raised.value)
    assert message.startswith(f'SomeStepStore: media_store={bad!r} ')
    assert why in message
    assert "Pass 'auto' (the default: the store's own media store), None (keep every payload inline)" in message
    assert 'or a media store' in message
    assert not called


def test_an_object_missing_one_method_is_refused() -> None:
    class NoMetadata(ReferenceShapedMediaStore):
        get_metadata = None  # pyright: ignore[reportAssignmentType, reportIncompatibleMethodOverride]

    with pytest.raises(TypeError, match='NoMetadata has no get_metadata'):
        check_media_store(NoMetadata(), owner='S')


# -- the in-memory store: 'auto' is no media store ---------------------------------------------


def _picture() -> list[ModelMessage]:
    image = BinaryContent(data=LARGE, media_type='image/png')  # pyright: ignore[reportCallIssue]
    return [ModelRequest(parts=[UserPromptPart(content=['look', image], timestamp=T)])]


@pytest.mark.parametrize('option', ['auto', None], ids=['auto', 'none'])
async def test_memory_store_keeps_bytes_inline_with_auto_and_none(option: Any) -> None:
    store = InMemoryStepStore(media_store=option)
    assert store.media_store is None
    await store.register_run(RunRecord(run_id='r', started_at=T))
    await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=0, messages=_picture()))
    latest = await store.latest_snapshot('r')
    assert latest is not None
    part = latest.messages[0].parts[0]
    assert isinstance(part, UserPromptPart)
    image = part.content[1]
    assert isinstance(image, BinaryContent)
    assert image.data == LARGE


@pytest.mark.parametrize('bad', ['disk', 7, {'media': 'x'}], ids=['str', 'int', 'dict'])
def test_memory_store_refuses_a_bogus_media_store_by_name(bad: Any) -> None:
    with pytest.raises((TypeError, ValueError), match=r"InMemoryStepStore: media_store=.* Pass 'auto'"):
        InMemoryStepStore(media_store=bad)


def test_memory_store_still_refuses_a_real_media_store() -> None:
    with pytest.raises(NotImplementedError, match="'media_externalization' is not declared"):
        InMemoryStepStore(media_store=InMemoryMediaStore())


def test_the_default_is_the_literal_auto() -> None:
    assert inspect.signature(InMemoryStepStore).parameters['media_store'].default == 'auto'


@pytest.mark.parametrize(
    'build',
    [
        lambda: stepcore.from_spec('memory', media_store='auto'),
        lambda: stepcore.open_store('memory://?media_store=auto'),
        lambda: stepcore.open_store('memory://', media_store='auto'),
        lambda: stepcore.StepPersistence.from_spec('memory', media_store='auto').store,
    ],
    ids=['from_spec', 'url', 'open_store-keyword', 'StepPersistence.from_spec'],
)
def test_auto_through_specs_and_urls(build: Any) -> None:
    store = build()
    assert isinstance(store, InMemoryStepStore)
    assert store.media_store is None


def test_a_bogus_value_through_a_url_is_refused() -> None:
    with pytest.raises(ValueError, match="media_store='disk'"):
        stepcore.open_store('memory://?media_store=disk')


# -- EngineStore: 'auto' without a default of its own is none ----------------------------------


class PassThrough(EngineStore):
    """A store handing its options to the engine unchanged, declaring no media feature."""

    def __init__(self, **options: Any) -> None:
        super().__init__(MemoryPort(), **options)


def test_engine_store_takes_auto_as_none_and_refuses_a_bogus_value() -> None:
    assert PassThrough(media_store='auto').media_store is None
    assert PassThrough().media_store is None
    with pytest.raises(TypeError, match=r'PassThrough: media_store=3\.5 is not a media store'):
        PassThrough(media_store=3.5)
    with pytest.raises(NotImplementedError, match='media_externalization'):
        PassThrough(media_store=InMemoryMediaStore())
