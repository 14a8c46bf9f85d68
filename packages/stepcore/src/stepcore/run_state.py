"""`stepcore.run_state` is now `stepcore.capability.run_state`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.capability.run_state as _moved
from stepcore.capability.run_state import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
