"""A backend's options and features, read from the store class its plugin names.

The constructor's signature is the list of options: a name it does not take is refused with the
names it does take and the closest one, before anything is built. `features` is read from the
class, where the backend declares it once.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import Any, get_args

__all__ = ('check_options', 'coerce_text_options', 'declared_features', 'option_names')

_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_TRUE = frozenset({'1', 'true', 'yes', 'on'})
_FALSE = frozenset({'0', 'false', 'no', 'off'})


def declared_features(factory: object) -> frozenset[str]:
    """The `features` a store class declares; an empty set for a class that declares none."""
    features: object = getattr(factory, 'features', frozenset[str]())
    if not isinstance(features, frozenset | set) or not all(isinstance(f, str) for f in features):  # pyright: ignore[reportUnknownVariableType]
        name = getattr(factory, '__qualname__', repr(factory))
        raise TypeError(f'{name}.features must be a frozenset of feature names, got {features!r}')
    return frozenset(features)  # pyright: ignore[reportUnknownArgumentType]


def _parameters(factory: object) -> dict[str, inspect.Parameter] | None:
    """The factory's keyword parameters; `None` when it takes any keyword (`**options`) or has no signature."""
    try:
        params = inspect.signature(factory).parameters  # pyright: ignore[reportArgumentType]
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return {name: p for name, p in params.items() if p.kind in _KEYWORD_KINDS and not name.startswith('_')}


def option_names(factory: object) -> list[str] | None:
    """The options a factory takes, in its signature's order; `None` when it takes any keyword."""
    params = _parameters(factory)
    return None if params is None else list(params)


def _closest(name: str, names: list[str]) -> list[str]:
    """The option `name` was probably meant to be: a close spelling, else the one it abbreviates."""
    close = difflib.get_close_matches(name, names, n=1)
    return close or [n for n in names if len(name) >= 3 and n.startswith(name)][:1]


def check_options(what: str, factory: object, options: Mapping[str, Any]) -> None:
    """Raise `ValueError` for an option `factory` does not take, or a required one left out.

    `what` names the backend in the message, e.g. `"step store backend 'sqlite'"`.
    """
    params = _parameters(factory)
    if params is None:
        return
    takes = ', '.join(params) or 'no options'
    unknown = [name for name in options if name not in params]
    if unknown:
        hints: list[str] = []
        for name in unknown:
            close = _closest(name, list(params))
            hints.append(f'{name!r} (did you mean {close[0]!r}?)' if close else repr(name))
        noun = 'option' if len(unknown) == 1 else 'options'
        raise ValueError(f'{what} has no {noun} {", ".join(hints)}; it takes: {takes}')
    missing = [name for name, p in params.items() if p.default is inspect.Parameter.empty and name not in options]
    if missing:
        raise ValueError(f'{what} needs option {", ".join(repr(m) for m in missing)}; it takes: {takes}')


def _scalar(annotation: object) -> type | None:
    """`int`, `float` or `bool` when the annotation is one of them (or it `| None`), else `None`."""
    if isinstance(annotation, str):
        names = {part.strip() for part in annotation.split('|')} - {'None'}
    else:
        args = get_args(annotation) or (annotation,)
        names = {getattr(arg, '__name__', repr(arg)) for arg in args if arg is not type(None)}
    scalars: dict[str, type] = {'int': int, 'float': float, 'bool': bool}
    return scalars.get(names.pop()) if len(names) == 1 else None


def _convert(what: str, name: str, text: str, kind: type) -> object:
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in _TRUE or lowered in _FALSE:
            return lowered in _TRUE
        raise ValueError(f'{what}: option {name}={text!r} must be true or false')
    try:
        return kind(text)
    except ValueError:
        noun = 'an integer' if kind is int else 'a number'
        raise ValueError(f'{what}: option {name}={text!r} must be {noun}') from None


def coerce_text_options(what: str, factory: object, options: Mapping[str, Any]) -> dict[str, Any]:
    """Options read from a URL, with text converted for parameters typed `int`, `float` or `bool`."""
    params = _parameters(factory) or {}
    coerced = dict(options)
    for name, value in options.items():
        param = params.get(name)
        kind = _scalar(param.annotation) if param is not None else None
        if kind is not None and isinstance(value, str):
            coerced[name] = _convert(what, name, value, kind)
    return coerced
