"""`stepcore.plugin` is now `stepcore.plugins.memory`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.plugins.memory as _moved
from stepcore.plugins.memory import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
