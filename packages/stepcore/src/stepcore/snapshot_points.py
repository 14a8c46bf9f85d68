"""`stepcore.snapshot_points` is now `stepcore.capability.snapshot_points`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.capability.snapshot_points as _moved
from stepcore.capability.snapshot_points import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
