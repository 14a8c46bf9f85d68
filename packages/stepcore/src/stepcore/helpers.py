"""`stepcore.helpers` is now `stepcore.recovery.history`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.recovery.history as _moved
from stepcore.recovery.history import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
