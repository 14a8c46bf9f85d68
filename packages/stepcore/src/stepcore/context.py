"""`stepcore.context` is now `stepcore.capability.context`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.capability.context as _moved
from stepcore.capability.context import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
