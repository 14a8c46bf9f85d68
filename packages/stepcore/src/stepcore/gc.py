"""`stepcore.gc` is now `stepcore.maintenance.gc`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.maintenance.gc as _moved
from stepcore.maintenance.gc import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
