"""`stepcore.registration` is now `stepcore.store.registration`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.store.registration as _moved
from stepcore.store.registration import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
