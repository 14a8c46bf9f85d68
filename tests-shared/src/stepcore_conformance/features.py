"""Declared features: known names, the protocol, and refusal of undeclared options."""

from __future__ import annotations

from typing import Any, cast

import pytest

from stepcore import Encryption, StepStore, generate_key
from stepcore.backend import ALL_FEATURES, ENCRYPTION, MEDIA_EXTERNALIZATION, SNAPSHOT_RETENTION, get_registry

from ._declared import declared, declared_by, refusing_class
from ._support import StoreFixtures, options

__all__ = ('FeaturesConformance',)


def _refused(request: pytest.FixtureRequest, feature: str, option: str) -> None:
    """Build the store with an option of `feature`: refused (`NotImplementedError`) exactly when undeclared."""
    refusal: NotImplementedError | None = None
    try:
        store = request.getfixturevalue('store')
    except NotImplementedError as error:
        refusal = error
        store = None
    if refusal is not None:
        cls = refusing_class(refusal)
        if cls is not None and feature in declared_by(cls):
            pytest.fail(
                f'{cls.__name__} declares feature {feature!r} but refused {option}: {refusal}. Support the option '
                'or remove the feature from features'
            )
        assert option in str(refusal), f'the refusal does not name {option!r}: {refusal}'
        return
    if feature in declared(store):
        pytest.skip(f'{type(store).__name__} declares feature {feature!r}: its tests run instead of the refusal check')
    pytest.fail(
        f'{type(store).__name__} accepted {option} without declaring feature {feature!r}: '
        'refuse it with stepcore.backend.require_feature (NotImplementedError) or declare the feature'
    )


class FeaturesConformance(StoreFixtures):
    """`features` is declared honestly: what is not declared is refused, not silently ignored."""

    async def test_store_implements_the_protocol(self, store: StepStore) -> None:
        assert isinstance(store, StepStore)
        features: object = getattr(type(store), 'features', None)
        assert isinstance(features, frozenset), f'{type(store).__name__}.features must be a frozenset, got {features!r}'
        unknown = set(cast(frozenset[str], features)) - ALL_FEATURES
        assert not unknown, f'unknown feature names {sorted(unknown)}; known: {sorted(ALL_FEATURES)}'

    @options({'max_snapshots_per_run': 2})
    def test_undeclared_snapshot_retention_is_refused(
        self, request: pytest.FixtureRequest, store_options: dict[str, Any]
    ) -> None:
        _refused(request, SNAPSHOT_RETENTION, 'max_snapshots_per_run')

    @options({'media_threshold_bytes': 1024})
    def test_undeclared_media_externalization_is_refused(
        self, request: pytest.FixtureRequest, store_options: dict[str, Any]
    ) -> None:
        _refused(request, MEDIA_EXTERNALIZATION, 'media_threshold_bytes')

    @options(lambda: {'encryption': Encryption(keys={'kit': generate_key()})})
    def test_undeclared_encryption_is_refused(
        self, request: pytest.FixtureRequest, store_options: dict[str, Any]
    ) -> None:
        _refused(request, ENCRYPTION, 'encryption')

    async def test_plugin_names_this_store_class(self, store: StepStore, store_spec: dict[str, Any] | None) -> None:
        """Features are declared once, on the class: the plugin entry must lead to that class."""
        if store_spec is None:
            pytest.skip(f'{type(self).__name__} has no store_spec fixture: the plugin entry cannot be found without it')
        backend = get_registry().get('step', str(store_spec.get('backend', 'memory')))
        assert backend.features() == type(store).features, (
            f'plugin {backend.distribution!r} registers backend {backend.info.key!r} as {backend.info.factory!r}, '
            f'whose features are {sorted(backend.features())}, but the store under test is '
            f'{type(store).__name__} with {sorted(type(store).features)}: point the plugin at the class you test'
        )
