"""MongoDB backends for stepcore: `MongoStepStore` and `MongoMediaStore`.

Both are imported on first access, so loading the plugin (`step_mongo.plugin`) does not import
pymongo.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .media import MongoMediaStore
    from .store import MongoStepStore

__all__ = ('MongoMediaStore', 'MongoStepStore')

_EXPORTS = {'MongoMediaStore': 'step_mongo.media', 'MongoStepStore': 'step_mongo.store'}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    return getattr(importlib.import_module(module), name)
