"""`stepcore.hookspecs` is now `stepcore.plugins.hookspecs`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.plugins.hookspecs as _moved
from stepcore.plugins.hookspecs import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
