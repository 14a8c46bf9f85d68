"""`stepcore.codec` is now `stepcore.store.codec`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.store.codec as _moved
from stepcore.store.codec import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
