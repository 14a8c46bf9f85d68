"""`stepcore.memory` is now `stepcore.store.memory`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.store.memory as _moved
from stepcore.store.memory import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
