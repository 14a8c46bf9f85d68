"""Whether two stores are one: `same_store`, the one place where stores are compared.

A store built on the engine keeps an id with its data (`EngineStore.store_identity`) and says where
that data lives (`EngineStore.store_location`). Two stores are one when both agree: the id alone does
not tell a copy of the data (a copied database file, a restored dump, which carries the id along) from
the original, and the location alone does not tell two stores apart that name their place alike.

A store that keeps no id (a class of one's own written to the reference's contract, or a wrapper that
forwards to another store) cannot be compared that way: only a store object is known to be itself,
and for any other pair `same_store` says it cannot tell.
"""

from __future__ import annotations

from stepcore.store.contract import as_step_store
from stepcore.store.step_store import StepStore

__all__ = ('same_store',)


async def same_store(a: object, b: object, *, names: tuple[str, str] | None = None) -> tuple[bool | None, str]:
    """Whether stores `a` and `b` (`StepStore` subclasses, or objects keeping the reference's contract)
    are one store, and a sentence saying why that names both by where their data lives (after
    `names`, when given: `("the agent's store", 'the given store')`).

    `(True, why)`: one store object, or the same store id in the same location. `(False, why)`:
    different store ids, or one store id in two locations (two copies of one store's data). `(None,
    why)`: it cannot be told, because `a` or `b` keeps no store id (see the module docstring).
    """
    first, second = as_step_store(a), as_step_store(b)
    name_a, name_b = await _label(first, a), await _label(second, b)
    if names is not None:
        name_a, name_b = f'{names[0]} ({name_a})', f'{names[1]} ({name_b})'
    if a is b:
        said = f'both are {name_a},' if name_a == name_b else f'{name_a} and {name_b} are'
        return True, f'{said} one store object'
    id_a, id_b = await _identity(first), await _identity(second)
    if id_a is None or id_b is None:
        lacking = [name for name, found in ((name_a, id_a), (name_b, id_b)) if found is None]
        keeps = 'keeps' if len(lacking) == 1 else 'keep'
        return None, (
            f'cannot tell whether {name_a} and {name_b} are one store: {" and ".join(lacking)} {keeps} no store id'
        )
    where_a, where_b = await _location(first), await _location(second)
    if id_a != id_b:
        if name_a == name_b:
            return False, f'they are two different stores, both {name_a} (store ids {id_a} and {id_b})'
        return False, f'{name_a} and {name_b} are different stores (store ids {id_a} and {id_b})'
    if where_a is not None and where_b is not None and where_a != where_b:
        return False, f'{name_a} and {name_b} are two copies of one store (both carry store id {id_a}), not one store'
    alone = '' if where_a is not None and where_b is not None else ', compared by store id alone'
    if name_a == name_b:
        return True, f'both are {name_a} (store id {id_a}{alone})'
    return True, f'{name_a} and {name_b} are one store (store id {id_a}{alone})'


async def _identity(store: StepStore) -> str | None:
    """The store's id, `None` when it keeps none (a port of an earlier release may not implement it)."""
    try:
        return await store.store_identity()
    except NotImplementedError:
        return None


async def _location(store: StepStore) -> str | None:
    try:
        return await store.store_location()
    except NotImplementedError:
        return None


async def _label(store: StepStore, given: object) -> str:
    """How a message names the store: where its data lives, else its class."""
    return await _location(store) or f'a {type(given).__name__}'
