"""`stepcore.registry` is now `stepcore.plugins.registry`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.plugins.registry as _moved
from stepcore.plugins.registry import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
