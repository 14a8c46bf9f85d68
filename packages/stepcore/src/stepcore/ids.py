"""`stepcore.ids` is now `stepcore.store.ids`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.store.ids as _moved
from stepcore.store.ids import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
