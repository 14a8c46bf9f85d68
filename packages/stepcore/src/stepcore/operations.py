"""`stepcore.operations` is now `stepcore.capability.operations`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.capability.operations as _moved
from stepcore.capability.operations import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
