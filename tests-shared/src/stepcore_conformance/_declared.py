"""What a store declares, and the gate in front of each test of an optional feature.

The rules the kit keeps (so it never certifies a claim it did not check):

- a test of a feature the store does not declare is skipped, with a reason `pytest -rs` shows;
- a feature the store declares but whose options it refuses (`NotImplementedError` when built
  with them) fails every test of that feature;
- a store declaring `persistent` without a `store_spec` fixture fails every persistence test.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import pytest

from stepcore.backend import PERSISTENT

__all__ = (
    'FEATURE_ATTRIBUTE',
    'Hook',
    'declared',
    'declared_by',
    'feature_gate',
    'feature_test',
    'features_of_test',
    'needs_feature',
    'refusal_verdict',
    'refusing_class',
    'require_feature_declared',
    'require_hook',
)

H = TypeVar('H')

FEATURE_ATTRIBUTE = '__stepcore_feature__'
"""Set on a kit test function: the features it checks (the report's verdicts are built from it)."""

F = TypeVar('F', bound=Callable[..., Any])


def declared(store: object) -> frozenset[str]:
    """The features the store's class declares."""
    return declared_by(type(store))


def declared_by(cls: type) -> frozenset[str]:
    """The features a store class declares."""
    features: object = getattr(cls, 'features', frozenset[str]())
    return cast(frozenset[str], features) if isinstance(features, frozenset) else frozenset[str]()


def features_of_test(function: object) -> tuple[str, ...]:
    """The features a kit test function checks (empty for tests every store runs)."""
    return cast(tuple[str, ...], getattr(function, FEATURE_ATTRIBUTE, ()))


def feature_test(*features: str) -> Callable[[F], F]:
    """Count the decorated test towards the verdict of `features`, without gating it."""

    def decorate(test: F) -> F:
        setattr(test, FEATURE_ATTRIBUTE, features)
        return test

    return decorate


def needs_feature(*features: str) -> Callable[[F], F]:
    """Run the decorated test only for a store that declares every one of `features`; skip it otherwise.

    The check happens in the `stepcore_feature_gate` fixture, before the test body: a store that
    refuses the test's `store_options` is skipped when it does not declare the feature, and fails
    when it does.
    """

    def decorate(test: F) -> F:
        setattr(test, FEATURE_ATTRIBUTE, features)
        return pytest.mark.usefixtures('stepcore_feature_gate')(test)

    return decorate


def require_feature_declared(store: object, feature: str) -> None:
    """Skip the calling test, with a reason shown by `pytest -rs`, unless the store declares `feature`."""
    if feature not in declared(store):
        pytest.skip(f'{type(store).__name__} does not declare feature {feature!r}')


def refusing_class(error: BaseException) -> type | None:
    """The class of the store whose constructor raised `error`, found in the traceback; `None` if no store was built.

    A store is recognised as an object with a class attribute `features` (a frozenset): the
    `self` of the constructor that raised.
    """
    for frame, _ in traceback.walk_tb(error.__traceback__):
        candidate: object = frame.f_locals.get('self')
        cls: type = type(candidate)
        if candidate is not None and isinstance(getattr(cls, 'features', None), frozenset):
            return cls
    return None


def refusal_verdict(error: NotImplementedError, features: tuple[str, ...], what: str) -> None:
    """Skip or fail a test whose store refused the options of `features` with `error`.

    Undeclared feature: skip with the reason. Declared: fail (the store claims what it refuses).
    No store object in the traceback: fail, since the kit cannot tell which of the two it is.
    """
    cls = refusing_class(error)
    wanted = ' and '.join(repr(f) for f in features)
    if cls is None:
        pytest.fail(
            f'the store fixture raised NotImplementedError for the options of {what} {wanted} before building a '
            f'store ({error}); refuse them from the store constructor (stepcore.backend.require_feature) so the '
            'kit can see what the store declares'
        )
    missing = [f for f in features if f not in declared_by(cls)]
    if missing:
        pytest.skip(
            f'needs feature {wanted}: {cls.__name__} does not declare {", ".join(repr(f) for f in missing)} '
            f'and refused its options ({error})'
        )
    pytest.fail(
        f'{cls.__name__} declares feature {wanted} but refused its options: {error}. Support the options '
        'or remove the feature from features'
    )


def feature_gate(request: pytest.FixtureRequest) -> None:
    """The `stepcore_feature_gate` fixture's body (see `needs_feature`)."""
    features = features_of_test(request.function)
    try:
        store = request.getfixturevalue('store')
    except NotImplementedError as error:
        refusal_verdict(error, features, 'feature')
        raise  # pragma: no cover  # refusal_verdict always skips or fails
    for needed in features:
        require_feature_declared(store, needed)
    if PERSISTENT in features and request.getfixturevalue('store_spec') is None:
        pytest.fail(
            f"{type(store).__name__} declares feature 'persistent' but {type(request.instance).__name__} has no "
            'store_spec fixture: override store_spec to return the stepcore.from_spec arguments (with backend=) '
            'that open another store over the same data, so the kit can check that data outlives the store'
        )


@dataclass(frozen=True)
class Hook:
    """A backend fixture a kit section needs to damage stored data, and how messages describe it."""

    fixture: str
    does: str
    """What the callable does, in the backend's own storage."""
    see: str
    """Where it is described."""
    needs: str
    """What the section needs it for (the reason a skip gives)."""


def require_hook(hook: H | None, store: object, owner: object, spec: Hook) -> H:
    """The backend's `spec.fixture` callable `hook` (of test class `owner`), when it has one.

    Without one the calling test fails for a store declaring `persistent` (its data outlives the
    process, so it can be damaged) and is skipped for others.
    """
    if hook is not None:
        return hook
    if PERSISTENT in declared(store):
        pytest.fail(
            f"{type(store).__name__} declares feature 'persistent' but {type(owner).__name__} has no {spec.fixture} "
            f"fixture: override {spec.fixture} with an async callable that {spec.does} in the backend's own storage "
            f'(see {spec.see})'
        )
    pytest.skip(f'{type(owner).__name__} has no {spec.fixture} fixture: {spec.needs}')
