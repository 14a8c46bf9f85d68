"""Optional backend behaviours, declared on a store class as `features = frozenset({...})`.

The conformance kit runs the tests of a declared feature and checks that an undeclared one is
refused with `NotImplementedError` rather than silently ignored.
"""

from __future__ import annotations

__all__ = (
    'ALL_FEATURES',
    'CHECKSUMS',
    'ENCRYPTION',
    'ENGINE_PORT',
    'LEASES',
    'MEDIA_COLLECTION',
    'MEDIA_EXTERNALIZATION',
    'PERSISTENT',
    'SNAPSHOT_RETENTION',
    'require_feature',
)

SNAPSHOT_RETENTION = 'snapshot_retention'
"""Accepts `max_snapshots_per_run` and prunes to the documented retain set."""
MEDIA_EXTERNALIZATION = 'media_externalization'
"""Accepts `media_store` / `media_threshold_bytes` and stores large payloads as media references."""
PERSISTENT = 'persistent'
"""Data outlives the process (files, databases)."""
MEDIA_COLLECTION = 'media_collection'
"""A media store that lists its blobs with the time each was last put, and deletes one only while it
is still that old: what `stepcore.maintenance.gc.collect_garbage` needs (see `stepcore.media.CollectableMediaStore`)."""

ENCRYPTION = 'encryption'
"""Accepts `encryption=` (a `stepcore.Encryption`) and keeps bodies and media blobs encrypted at rest."""
CHECKSUMS = 'checksums'
"""Checks a checksum on every record it reads: a stored body altered after it was written is damage."""
ENGINE_PORT = 'engine_port'
"""Built on `stepcore.engine.EngineStore`: every read and write goes through an I/O port (`store.port`)
and stops at the engine's write boundaries (`stepcore.engine.faults`), where the conformance kit
injects faults and watches what reaches storage. Every `EngineStore` subclass declares it."""

LEASES = 'leases'
"""Keeps run ownership (`stepcore.store.leases`): a lease per run, swapped atomically on the store
(compare and set, with the store's clock), listed by state through an index, and a fence on every
write of a run (`get_lease`, `swap_lease`, `list_leases`, `lease_start`)."""

ALL_FEATURES = frozenset(
    {
        SNAPSHOT_RETENTION,
        MEDIA_EXTERNALIZATION,
        PERSISTENT,
        MEDIA_COLLECTION,
        ENCRYPTION,
        CHECKSUMS,
        ENGINE_PORT,
        LEASES,
    }
)


def require_feature(store: object, feature: str, *, option: str) -> None:
    """Raise `NotImplementedError` when `store` is asked for an option of a feature it lacks."""
    features: frozenset[str] = getattr(type(store), 'features', frozenset())
    if feature not in features:
        raise NotImplementedError(
            f'{type(store).__name__} does not support {option} (feature {feature!r} is not declared by this backend)'
        )
