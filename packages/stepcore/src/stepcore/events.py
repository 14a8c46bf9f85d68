"""`stepcore.events` is now `stepcore.capability.events`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.capability.events as _moved
from stepcore.capability.events import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
