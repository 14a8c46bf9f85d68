"""`stepcore.history` is now `stepcore.engine.history`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.engine.history as _moved
from stepcore.engine.history import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
