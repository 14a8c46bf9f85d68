"""The conformance suite every stepcore backend passes.

Subclass a base class in your backend's tests and override one fixture::

    class TestMyStore(StepStoreConformance):
        @pytest.fixture
        async def store(self, store_options):
            yield MyStore(**store_options)

See the package README for the fixtures (`store`, `store_spec`, `damage`), the feature flags and
the verdicts the closing report gives.

This package is also the kit's pytest plugin (the closing report, and assertion rewriting of the
kit's own tests). It is never loaded on its own: opt in with `pytest_plugins = ['stepcore_conformance']`
in the conftest.py at your rootdir, or `-p stepcore_conformance` on the command line or in `addopts`.
"""

from __future__ import annotations

from ._support import Damage
from .approvals import ApprovalsConformance
from .batches import BatchWritesConformance
from .capability import CapabilityConformance
from .concurrency import ConcurrencyConformance
from .contract import ContractConformance
from .crash_window import CrashWindowConformance
from .damage import DamageConformance
from .delete import DeleteConformance
from .effects import EffectsConformance
from .encryption import ChecksumConformance, EncryptionConformance
from .events import EventsConformance
from .externalization import MediaExternalizationConformance
from .features import FeaturesConformance
from .history import HistoryConformance
from .identity import StoreIdentityConformance
from .leases import LeasesConformance
from .lifecycle import DeleteConversationConformance, PruneConformance
from .media import MediaDamage, MediaStoreConformance
from .media_collection import MediaCollectionConformance
from .media_subclass import MediaSubclassConformance
from .memory_media import InMemoryMediaStore
from .paging import PagingConformance
from .persistence import PersistenceConformance
from .retention import RetentionConformance
from .runs import RunsConformance
from .snapshots import SnapshotsConformance
from .subclass import SubclassConformance

__all__ = (
    'ApprovalsConformance',
    'BatchWritesConformance',
    'CapabilityConformance',
    'ChecksumConformance',
    'ConcurrencyConformance',
    'ContractConformance',
    'CrashWindowConformance',
    'Damage',
    'DamageConformance',
    'DeleteConformance',
    'DeleteConversationConformance',
    'EffectsConformance',
    'EncryptionConformance',
    'EventsConformance',
    'FeaturesConformance',
    'HistoryConformance',
    'InMemoryMediaStore',
    'LeasesConformance',
    'MediaCollectionConformance',
    'MediaDamage',
    'MediaExternalizationConformance',
    'MediaStoreConformance',
    'MediaSubclassConformance',
    'PagingConformance',
    'PersistenceConformance',
    'PruneConformance',
    'RetentionConformance',
    'RunsConformance',
    'SnapshotsConformance',
    'StepStoreConformance',
    'StoreIdentityConformance',
    'SubclassConformance',
)

pytest_plugins = ('stepcore_conformance.report',)
"""Registered with pytest when this package is loaded as a plugin (see the module docstring)."""


class StepStoreConformance(
    FeaturesConformance,
    RunsConformance,
    EventsConformance,
    SnapshotsConformance,
    HistoryConformance,
    EffectsConformance,
    BatchWritesConformance,
    DeleteConformance,
    PagingConformance,
    DeleteConversationConformance,
    PruneConformance,
    RetentionConformance,
    MediaExternalizationConformance,
    ConcurrencyConformance,
    PersistenceConformance,
    CrashWindowConformance,
    DamageConformance,
    EncryptionConformance,
    ChecksumConformance,
    CapabilityConformance,
    ContractConformance,
    SubclassConformance,
    LeasesConformance,
    ApprovalsConformance,
    StoreIdentityConformance,
):
    """Every section of the step-store suite. Override `store` (and `store_spec` and `damage` where they apply)."""
