"""Media externalization through a step store (feature `media_externalization`).

Binary content and strings at or above `media_threshold_bytes` (binary content counted in bytes,
strings in UTF-8 bytes) leave the stored snapshot for a
`MediaStore` and come back exactly on read. Tests run twice: with the backend's default media
store, and with the kit's `InMemoryMediaStore` passed as `media_store=`, which lets them check
what was actually externalized.

`media_store='auto'` is every store's default and callers pass it explicitly, so every store
takes it, with or without the feature: it means the store's own default media store (none for a
store that keeps payloads inline). Any other value that is neither `None` nor a media store is
refused with `TypeError` or `ValueError` naming `media_store`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, cast

import pytest
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)

from stepcore import MediaStore, StepStore
from stepcore.backend import MEDIA_EXTERNALIZATION, SNAPSHOT_RETENTION, media_uri

from ._declared import declared, feature_test, refusal_verdict
from ._support import (
    StoreFixtures,
    at,
    canonical,
    needs_feature,
    options,
    register,
    snapshot,
    tool_exchange,
    tool_return_content,
    user,
)
from .memory_media import InMemoryMediaStore
from .snapshots import RESERVED_KEY_PAYLOAD

__all__ = ('MediaExternalizationConformance',)

THRESHOLD = 1024
ALL_BYTES = bytes(range(256)) * 12
"""Every byte value: base64 of it uses `+`/`/` (standard) or `-`/`_` (URL-safe), catching alphabet mix-ups."""
PDF = b'%PDF-1.7\n' + bytes(range(200, 256)) * 3


def _binary(*, data: bytes, media_type: str) -> BinaryContent:
    return cast(Callable[..., BinaryContent], BinaryContent)(data=data, media_type=media_type)


def default_media() -> dict[str, Any]:
    """The backend's own default media store, with a low threshold."""
    return {'media_threshold_bytes': THRESHOLD}


def auto_media() -> dict[str, Any]:
    """`media_store='auto'` (the backend's own default media store), with a low threshold."""
    return {'media_store': 'auto', 'media_threshold_bytes': THRESHOLD}


def kit_media() -> dict[str, Any]:
    """The kit's `InMemoryMediaStore` (fresh per test), with a low threshold."""
    return {'media_store': InMemoryMediaStore(), 'media_threshold_bytes': THRESHOLD}


def kit_media_default_threshold() -> dict[str, Any]:
    """The kit's `InMemoryMediaStore`, with the default threshold (64 KiB)."""
    return {'media_store': InMemoryMediaStore()}


def kit_media_with_retention() -> dict[str, Any]:
    """`kit_media` with `max_snapshots_per_run=1`."""
    return {**kit_media(), 'max_snapshots_per_run': 1}


def _default_media_store(store: StepStore) -> MediaStore:
    """The media store a store built with `media_store='auto'` keeps as its `media_store` attribute."""
    media: object = getattr(store, 'media_store', None)
    if not isinstance(media, MediaStore) or isinstance(media, type):
        pytest.fail(
            f"{type(store).__name__} declares feature 'media_externalization' but, built with media_store='auto', "
            f'its media_store attribute is {media!r}, not its default media store'
        )
    return media


def _kit_media_store(store_options: dict[str, Any]) -> InMemoryMediaStore:
    return cast(InMemoryMediaStore, store_options['media_store'])


def _media_messages() -> list[ModelMessage]:
    big_text = 'Large tool output ✓ ' * 200  # > THRESHOLD bytes, multi-byte characters included
    return [
        ModelRequest(
            parts=[
                UserPromptPart(
                    content=[
                        'describe these',
                        _binary(data=ALL_BYTES, media_type='image/png'),
                        _binary(data=PDF, media_type='application/pdf'),
                        _binary(data=b'x', media_type='audio/wav'),
                    ],
                    timestamp=at(0),
                )
            ]
        ),
        ModelResponse(parts=[TextPart(content='Long answer. ' * 100)], model_name='kit-model', timestamp=at(1)),
        *tool_exchange(2, content=big_text),
        *tool_exchange(3, content={'report': big_text, 'short': 'kept inline', 'rows': [big_text[:10]]}),
    ]


def _binary_data(messages: list[ModelMessage]) -> list[bytes]:
    first = messages[0]
    assert isinstance(first, ModelRequest)
    part = first.parts[0]
    assert isinstance(part, UserPromptPart)
    data_of = operator.attrgetter('data')  # pyright reads BinaryContent as a bare pydantic dataclass
    return [cast(bytes, data_of(c)) for c in part.content if isinstance(c, BinaryContent)]


BOTH = options(default_media, kit_media)

LARGE_IMAGE = bytes(range(256)) * 260
"""65 KiB: above the default threshold (64 KiB) of a store that externalizes."""
BOGUS_MEDIA_STORES: tuple[object, ...] = ('disk', 42, {'kind': 'disk'})


class MediaExternalizationConformance(StoreFixtures):
    """Round-trips of binary content and large text through `media_store` / `media_threshold_bytes`."""

    @pytest.fixture
    def media_store_auto_accepted(self, request: pytest.FixtureRequest) -> None:
        """Build the store with `media_store='auto'`: refusing it fails, whatever the store declares."""
        try:
            request.getfixturevalue('store')
        except NotImplementedError as error:
            pytest.fail(
                f"the store refused media_store='auto' ({error}). 'auto' is the default of media_store= and callers "
                "pass it explicitly: take it as the store's own default media store, which for a store without "
                "feature 'media_externalization' is none (stepcore.backend.resolve_media_store does this)"
            )

    @options({'media_store': 'auto'})
    @pytest.mark.usefixtures('media_store_auto_accepted')
    async def test_media_store_auto_is_every_stores_default(self, store: StepStore) -> None:
        run_id = await register(store)
        image = _binary(data=LARGE_IMAGE, media_type='image/png')
        messages: list[ModelMessage] = [
            ModelRequest(parts=[UserPromptPart(content=['look', image], timestamp=at(0))]),
            *tool_exchange(1, content='small'),
        ]
        await store.save_snapshot(snapshot(run_id, messages))
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == canonical(messages)
        assert _binary_data(latest.messages) == [LARGE_IMAGE]
        if MEDIA_EXTERNALIZATION in declared(store):
            media = _default_media_store(store)
            assert await media.exists(media_uri(LARGE_IMAGE)), (
                f"with media_store='auto' a 64 KiB image did not reach the default media store {media!r}"
            )

    @options(auto_media)
    @needs_feature(MEDIA_EXTERNALIZATION)
    async def test_media_store_auto_externalizes_to_the_default_media_store(self, store: StepStore) -> None:
        run_id = await register(store)
        messages = _media_messages()
        await store.save_snapshot(snapshot(run_id, messages))
        media = _default_media_store(store)
        big_text = ('Large tool output ✓ ' * 200).encode()
        for data, what in ((ALL_BYTES, 'binary content'), (big_text, 'a string')):
            assert await media.get(media_uri(data)) == data, f'{what} above the threshold did not reach {media!r}'
        assert not await media.exists(media_uri(PDF)), 'binary content below the threshold was externalized'
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == canonical(messages)
        assert _binary_data(latest.messages) == [ALL_BYTES, PDF, b'x']
        other = await register(store)
        await store.save_snapshot(snapshot(other, [user('again'), *messages[1:]]))
        again = await store.latest_snapshot(run_id=other)
        assert again is not None
        assert again.messages[1:] == canonical(messages)[1:]

    @options(*({'media_store': bad} for bad in BOGUS_MEDIA_STORES))
    @feature_test(MEDIA_EXTERNALIZATION)
    def test_a_bogus_media_store_is_refused(
        self, request: pytest.FixtureRequest, store_options: dict[str, Any]
    ) -> None:
        bad: object = store_options['media_store']
        rejection: TypeError | ValueError | None = None
        try:
            request.getfixturevalue('store')
        except NotImplementedError as error:
            refusal_verdict(error, (MEDIA_EXTERNALIZATION,), 'feature')
        except (TypeError, ValueError) as error:
            rejection = error
        if rejection is None:
            pytest.fail(
                f"media_store={bad!r} was accepted; it must raise TypeError or ValueError: media_store= takes 'auto', "
                'None or a media store'
            )
        message = str(rejection)
        for needed in ('media_store', repr(bad), "'auto'"):
            assert needed in message, f'the error does not say {needed}: {rejection}'

    @BOTH
    @needs_feature(MEDIA_EXTERNALIZATION)
    async def test_binary_and_large_text_round_trip(self, store: StepStore) -> None:
        run_id = await register(store)
        messages = _media_messages()
        await store.save_snapshot(snapshot(run_id, messages))
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == canonical(messages)
        assert _binary_data(latest.messages) == [ALL_BYTES, PDF, b'x']
        listed = await store.list_snapshots(run_id=run_id)
        assert [s.messages for s in listed] == [canonical(messages)]

    @options(kit_media)
    @needs_feature(MEDIA_EXTERNALIZATION)
    async def test_payloads_are_stored_in_the_media_store(
        self, store: StepStore, store_options: dict[str, Any]
    ) -> None:
        media = _kit_media_store(store_options)
        run_id = await register(store)
        messages = _media_messages()
        await store.save_snapshot(snapshot(run_id, messages))
        blobs = media.blobs
        assert blobs.get(media_uri(ALL_BYTES)) == ALL_BYTES, 'binary content above the threshold was not externalized'
        for data in (PDF, b'x'):
            assert media_uri(data) not in blobs, 'binary content below the threshold was externalized'
        big_text = ('Large tool output ✓ ' * 200).encode()
        assert blobs.get(media_uri(big_text)) == big_text, 'a string above the threshold was not externalized'
        assert media_uri(b'kept inline') not in blobs
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == canonical(messages)

    @options(kit_media)
    @needs_feature(MEDIA_EXTERNALIZATION)
    async def test_threshold_is_inclusive(self, store: StepStore, store_options: dict[str, Any]) -> None:
        media = _kit_media_store(store_options)
        run_id = await register(store)
        at_threshold = 'é' * (THRESHOLD // 2)  # exactly THRESHOLD bytes in UTF-8, half as many characters
        below = 'a' * (THRESHOLD - 1)
        messages = [*tool_exchange(1, content=at_threshold), *tool_exchange(2, content=below)]
        await store.save_snapshot(snapshot(run_id, messages))
        assert media_uri(at_threshold.encode()) in media.blobs
        assert media_uri(below.encode()) not in media.blobs
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == messages

    @options(kit_media)
    @needs_feature(MEDIA_EXTERNALIZATION)
    async def test_binary_threshold_counts_its_bytes(self, store: StepStore, store_options: dict[str, Any]) -> None:
        media = _kit_media_store(store_options)
        run_id = await register(store)
        at_threshold = bytes(range(256)) * (THRESHOLD // 256)
        # One byte short, although its base64 is a third longer than the threshold.
        below = at_threshold[:-1]
        messages: list[ModelMessage] = [
            ModelRequest(
                parts=[
                    UserPromptPart(
                        content=[
                            _binary(data=at_threshold, media_type='image/png'),
                            _binary(data=below, media_type='image/jpeg'),
                        ],
                        timestamp=at(0),
                    )
                ]
            )
        ]
        await store.save_snapshot(snapshot(run_id, messages))
        assert media_uri(at_threshold) in media.blobs, 'binary content at the threshold was not externalized'
        assert media_uri(below) not in media.blobs, 'binary content below the threshold was externalized'
        assert len(media.blobs) == 1, f'only one payload reaches the threshold: {sorted(media.blobs)}'
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == canonical(messages)
        assert _binary_data(latest.messages) == [at_threshold, below]

    @options(kit_media_default_threshold)
    @needs_feature(MEDIA_EXTERNALIZATION)
    async def test_small_binary_stays_inline_under_the_default_threshold(
        self, store: StepStore, store_options: dict[str, Any]
    ) -> None:
        media = _kit_media_store(store_options)
        run_id = await register(store)
        small = bytes(range(256)) * 4  # 1 KiB, the default threshold being 64 KiB
        large = bytes(range(256)) * 256  # 64 KiB
        messages: list[ModelMessage] = [
            ModelRequest(
                parts=[
                    UserPromptPart(
                        content=[
                            _binary(data=small, media_type='image/png'),
                            _binary(data=large, media_type='image/png'),
                        ],
                        timestamp=at(0),
                    )
                ]
            )
        ]
        await store.save_snapshot(snapshot(run_id, messages))
        assert sorted(media.blobs) == [media_uri(large)], 'only the 64 KiB binary may leave the snapshot'
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert _binary_data(latest.messages) == [small, large]

    @BOTH
    @needs_feature(MEDIA_EXTERNALIZATION)
    async def test_reserved_keys_and_binary_shaped_data_round_trip(self, store: StepStore) -> None:
        run_id = await register(store)
        shaped: list[Any] = [
            RESERVED_KEY_PAYLOAD,
            {'kind': 'binary', 'data': 'hello world'},  # not base64
            {'kind': 'binary', 'data': 'aGVsbG8'},  # unpadded
            # A dict that also carries `media_type` would load back as BinaryContent in pydantic-ai
            # itself, so these stay plain tool output.
            {'kind': 'binary', 'data': '+/+/AAAA'},  # standard alphabet
            {'kind': 'binary', 'data': '-_-_AAAA'},  # URL-safe alphabet
            {'kind': 'binary', 'data': 'aGVs\nbG8='},  # base64 with a newline
            {'kind': 'binary', 'data': 12},
        ]
        messages = [*tool_exchange(1, content=shaped), *tool_exchange(2, content={'__stepcore_media__': 'x' * 2000})]
        await store.save_snapshot(snapshot(run_id, messages))
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == messages
        assert tool_return_content(latest.messages[1]) == shaped

    @options(kit_media)
    @needs_feature(MEDIA_EXTERNALIZATION)
    async def test_media_shared_by_many_snapshots(self, store: StepStore, store_options: dict[str, Any]) -> None:
        media = _kit_media_store(store_options)
        run_id = await register(store)
        live = _media_messages()
        expected: list[list[ModelMessage]] = []
        puts_after_first_save = 0
        for step in range(5):
            live.extend(tool_exchange(10 + step))
            await store.save_snapshot(snapshot(run_id, live, step_index=step))
            expected.append(canonical(live))
            puts_after_first_save = puts_after_first_save or media.puts
        assert [s.messages for s in await store.list_snapshots(run_id=run_id)] == expected
        # Later saves add no media, and the messages holding media are not written again.
        assert media.puts == puts_after_first_save, 'unchanged messages were externalized again on a later save'

    @options(kit_media_with_retention)
    @needs_feature(MEDIA_EXTERNALIZATION, SNAPSHOT_RETENTION)
    async def test_pruning_keeps_media(self, store: StepStore, store_options: dict[str, Any]) -> None:
        # Blobs are content-addressed and may be shared: pruning a snapshot never deletes them.
        media = _kit_media_store(store_options)
        run_id = await register(store)
        messages = _media_messages()
        await store.save_snapshot(snapshot(run_id, messages, step_index=0))
        stored = dict(media.blobs)
        assert stored, 'the save externalized nothing to the media store it was given'
        for step in range(1, 4):
            await store.save_snapshot(snapshot(run_id, [*messages, *tool_exchange(step)], step_index=step))
        assert [s.step_index for s in await store.list_snapshots(run_id=run_id)] == [3]
        for uri, data in stored.items():
            assert await media.get(uri) == data
        other = await register(store)
        await store.save_snapshot(snapshot(other, messages))
        latest = await store.latest_snapshot(run_id=other)
        assert latest is not None
        assert latest.messages == canonical(messages)
