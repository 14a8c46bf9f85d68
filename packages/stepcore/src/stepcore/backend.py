"""Everything a backend author imports, from one place.

A step store is a port of the storage engine (`EngineStore` and `SyncPort` or `AsyncPort`, with the
operations in `ops`); a media store is a blob port of the media engine (`MediaEngine`). The plugin
registers both (`BackendInfo`, `hookimpl`). See `docs/plugins.md` for a walk through the template
backend, and `docs/engine.md` for the port's contract.
"""

from __future__ import annotations

from stepcore.engine import (
    Ask,
    AsyncPort,
    DamagedRecordError,
    EngineStore,
    Fenced,
    KeyConflict,
    NodeIdBlocks,
    PipelinedPort,
    Port,
    StaleHistory,
    SyncPort,
    ops,
)
from stepcore.engine.encryption import Encryption
from stepcore.engine.fileio import fsync_dir, make_dir, write_atomic
from stepcore.engine.setup_once import SetupOnce
from stepcore.engine.worker import WorkerThread, WouldBlock, running_inline
from stepcore.media import (
    AUTO,
    EMPTY_CONTEXT,
    KeyStrategy,
    MediaContext,
    MediaStore,
    MediaStoreOption,
    PublicUrlResolver,
    check_media_store,
    default_key,
    resolve_media_store,
)
from stepcore.media.blobs import (
    BlobHead,
    BlobMeta,
    BlobRef,
    DamagedMediaError,
    ListedBlob,
    MediaEngine,
    MediaNotFoundError,
    digest_in_name,
    from_micros,
    micros,
    now_micros,
    strategy_key,
)
from stepcore.media.walker import DEFAULT_MEDIA_THRESHOLD_BYTES
from stepcore.plugins.hookspecs import BackendInfo, hookimpl
from stepcore.plugins.urls import local_path, query_options
from stepcore.store.features import (
    CHECKSUMS,
    ENCRYPTION,
    ENGINE_PORT,
    LEASES,
    MEDIA_COLLECTION,
    MEDIA_EXTERNALIZATION,
    PERSISTENT,
    SNAPSHOT_RETENTION,
    require_feature,
)
from stepcore.store.ids import validate_path_safe_run_id
from stepcore.store.models import RECORD_FORMAT_VERSION, SnapshotState, ToolEffectStatus, utcnow
from stepcore.store.protocols import StepStore
from stepcore.store.retention import check_max_snapshots

__all__ = (
    'AUTO',
    'CHECKSUMS',
    'DEFAULT_MEDIA_THRESHOLD_BYTES',
    'EMPTY_CONTEXT',
    'ENCRYPTION',
    'ENGINE_PORT',
    'LEASES',
    'MEDIA_COLLECTION',
    'MEDIA_EXTERNALIZATION',
    'PERSISTENT',
    'RECORD_FORMAT_VERSION',
    'SNAPSHOT_RETENTION',
    'Ask',
    'AsyncPort',
    'BackendInfo',
    'BlobHead',
    'BlobMeta',
    'BlobRef',
    'DamagedMediaError',
    'DamagedRecordError',
    'Encryption',
    'EngineStore',
    'Fenced',
    'KeyConflict',
    'KeyStrategy',
    'ListedBlob',
    'MediaContext',
    'MediaEngine',
    'MediaNotFoundError',
    'MediaStore',
    'MediaStoreOption',
    'NodeIdBlocks',
    'PipelinedPort',
    'Port',
    'PublicUrlResolver',
    'SetupOnce',
    'SnapshotState',
    'StaleHistory',
    'StepStore',
    'SyncPort',
    'ToolEffectStatus',
    'WorkerThread',
    'WouldBlock',
    'check_max_snapshots',
    'check_media_store',
    'default_key',
    'digest_in_name',
    'from_micros',
    'fsync_dir',
    'hookimpl',
    'local_path',
    'make_dir',
    'micros',
    'now_micros',
    'ops',
    'query_options',
    'require_feature',
    'resolve_media_store',
    'running_inline',
    'strategy_key',
    'utcnow',
    'validate_path_safe_run_id',
    'write_atomic',
)
