"""`stepcore.retention` is now `stepcore.store.retention`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.store.retention as _moved
from stepcore.store.retention import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
