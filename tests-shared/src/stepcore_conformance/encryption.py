"""Encryption at rest (feature `encryption`) and checksums (feature `checksums`).

Encryption: a store built with `encryption=` reads back what it wrote; what it hands its storage
holds none of a run's text (the kit watches the operations a store built on the engine sends its
port, and the blobs it sends its media store); a store opened over the same data without the key,
or with other key bytes under the same key id, raises `stepcore.EncryptionKeyError` naming the id.

Checksums: a stored body altered after it was written, into one that still parses and
validates, is reported as damage (the backend's `damage` fixture writes it).
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from pydantic_ai import BinaryContent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from stepcore import (
    DamagedRecordError,
    Encryption,
    EncryptionKeyError,
    EngineStore,
    StepStore,
    ToolEffectStatus,
    from_spec,
    generate_key,
)
from stepcore.backend import (
    CHECKSUMS,
    EFFECT_FIELDS_IN_ROW,
    ENCRYPTION,
    ENGINE_PORT,
    EVENT_FIELDS_IN_ROW,
    MEDIA_EXTERNALIZATION,
    Sealer,
    dump_record_compact,
)

from ._declared import declared
from ._support import Damage, StoreFixtures, at, event, needs_feature, options, register, snapshot
from .damage import _hook  # pyright: ignore[reportPrivateUsage]
from .effects import effect

__all__ = ('ChecksumConformance', 'EncryptionConformance')

KIT_KEY = generate_key()
MARKERS = (b'kit-prompt-marker-31f', b'kit-tool-marker-8c2', b'kit-media-marker-d95')


def _encrypted() -> dict[str, Any]:
    return {'encryption': Encryption(keys={'kit': KIT_KEY})}


def _messages() -> list[ModelMessage]:
    blob = BinaryContent(data=MARKERS[2] * 8000, media_type='application/octet-stream')  # pyright: ignore[reportCallIssue]
    return [
        ModelRequest(parts=[UserPromptPart([MARKERS[0].decode(), blob], timestamp=at(0))]),
        ModelResponse(parts=[TextPart(MARKERS[1].decode())], timestamp=at(1)),
    ]


class _Spy:
    """Every body and blob a store built on the engine hands its port and its media store."""

    def __init__(self, store: EngineStore) -> None:
        self.seen: list[bytes] = []
        port: Any = store.port
        run = port.run

        def spying(tx: Any, op: Any) -> Any:
            if op.writes:
                self.seen.append(repr(op).encode())
                for value in (getattr(op, 'bodies', ()), [getattr(op, 'row', None)], getattr(op, 'rows', ())):
                    for item in cast(Any, value):
                        body = getattr(item, 'body', item)
                        if isinstance(body, bytes | str):
                            self.seen.append(body if isinstance(body, bytes) else body.encode())
            return run(tx, op)

        port.run = spying
        media: Any = store.media_store
        if media is not None:
            put = media.put

            async def spying_put(data: bytes, **kwargs: Any) -> str:
                self.seen.append(data)
                return await put(data, **kwargs)

            media.put = spying_put

    def holds(self, marker: bytes) -> bool:
        return any(marker in seen for seen in self.seen)


async def _write(store: StepStore) -> str:
    run_id = await register(store, conversation_id='kit-conv')
    await store.append_event(event(run_id, 1, metadata={'note': MARKERS[0].decode()}))
    await store.record_tool_effect(
        effect(run_id, 'c1', status=ToolEffectStatus.COMPLETED, args={'x': MARKERS[1].decode()})
    )
    await store.save_snapshot(snapshot(run_id, _messages(), step_index=1))
    return run_id


class EncryptionConformance(StoreFixtures):
    """`encryption=`: round trip, nothing in clear, a wrong or missing key named (feature `encryption`)."""

    @options(_encrypted)
    @needs_feature(ENCRYPTION)
    async def test_encrypted_round_trip_stores_nothing_in_clear(self, store: StepStore) -> None:
        if ENGINE_PORT not in declared(store):
            pytest.fail(
                f'{type(store).__name__} declares {ENCRYPTION!r} but not {ENGINE_PORT!r}: '
                'the kit checks what the engine hands the port'
            )
        engine = cast(EngineStore, store)
        spy = _Spy(engine)
        run_id = await _write(store)
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == _messages()  # media included: restored from the media store
        (read,) = await store.list_events(run_id=run_id)
        assert read.metadata == {'note': MARKERS[0].decode()}
        (entry,) = await store.list_tool_effects(run_id=run_id)
        assert entry.args == {'x': MARKERS[1].decode()}
        assert spy.seen, 'the store wrote nothing through its port'
        media = MEDIA_EXTERNALIZATION in declared(store) and engine.media_store is not None
        for marker in MARKERS if media else MARKERS[:2]:
            assert not spy.holds(marker), f'{marker!r} reached the storage in clear'

    @options(_encrypted)
    @needs_feature(ENCRYPTION)
    async def test_a_missing_or_wrong_key_is_an_error_naming_it(
        self, store: StepStore, store_spec: dict[str, Any] | None
    ) -> None:
        if store_spec is None:
            # no second store can open the same data: the bodies the store wrote are opened with
            # other keys the way the engine opens them
            if ENGINE_PORT not in declared(store):
                pytest.fail(f'{type(store).__name__} declares {ENCRYPTION!r} without a store_spec fixture')
            spy = _Spy(cast(EngineStore, store))
            await _write(store)
            records = [b for b in spy.seen if b.startswith(b'{"format":')]
            assert records, 'the store wrote no record bodies'
            for keys in (None, Encryption(keys={'kit': generate_key()})):
                with pytest.raises(EncryptionKeyError, match="'kit'") as raised:
                    Sealer(keys).open_record(records[0], frozenset(), ())
                assert raised.value.key_id == 'kit'
            return
        run_id = await _write(store)
        for keys in (None, Encryption(keys={'kit': generate_key()})):
            spec: dict[str, Any] = {**store_spec, **({} if keys is None else {'encryption': keys})}
            other = from_spec(**spec)
            try:
                with pytest.raises(EncryptionKeyError, match="'kit'") as raised:
                    await other.latest_snapshot(run_id)
                assert raised.value.key_id == 'kit'
                with pytest.raises(EncryptionKeyError, match="'kit'"):
                    await other.list_tool_effects(run_id)
            finally:
                await other.aclose()


class ChecksumConformance(StoreFixtures):
    """A stored body altered into one that still parses is damage, not a different record (feature `checksums`)."""

    @needs_feature(CHECKSUMS)
    async def test_an_altered_body_is_reported_not_returned(self, store: StepStore, damage: Damage | None) -> None:
        hook = _hook(damage, store, self)
        run_id = await register(store)
        original = event(run_id, 1, metadata={'amount': '10'})
        await store.append_event(original)
        (stored,) = await store.list_events(run_id=run_id)
        # the body the engine wrote, with one value changed and its checksum kept
        body = Sealer().record(dump_record_compact(original, exclude=EVENT_FIELDS_IN_ROW), (run_id,))
        altered = body.replace(b'"amount":"10"', b'"amount":"90"')
        assert altered != body
        await hook(store, 'event', run_id, stored.seq, altered)
        assert await store.list_events(run_id=run_id) == [], 'an altered event must be skipped, not returned'

        entry = effect(run_id, 'c1', status=ToolEffectStatus.COMPLETED, args={'to': 'alice'})
        await store.record_tool_effect(entry)
        columns = (run_id, 'c1', entry.status.value)
        body = Sealer().record(dump_record_compact(entry, exclude=EFFECT_FIELDS_IN_ROW), columns)
        await hook(store, 'effect', run_id, 'c1', body.replace(b'"to":"alice"', b'"to":"mallory"'))
        with pytest.raises(DamagedRecordError, match='checksum'):
            await store.list_tool_effects(run_id=run_id)
        # the unresolved listing reads a settled entry's bytes rather than its fields: it catches it too
        with pytest.raises(DamagedRecordError, match='checksum'):
            await store.list_unresolved_tool_effects(run_id=run_id)
