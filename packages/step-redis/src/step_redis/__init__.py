"""Redis backends for stepcore: `RedisStepStore` and `RedisMediaStore`.

Both are imported on first access, so loading the plugin (`step_redis.plugin`) does not import
redis-py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .media import RedisMediaStore
    from .store import RedisStepStore

__all__ = ('RedisMediaStore', 'RedisStepStore')

_EXPORTS = {'RedisMediaStore': 'step_redis.media', 'RedisStepStore': 'step_redis.store'}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    return getattr(importlib.import_module(module), name)
