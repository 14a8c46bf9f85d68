"""`stepcore.features` is now `stepcore.store.features`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.store.features as _moved
from stepcore.store.features import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
