"""`stepcore.urls` is now `stepcore.plugins.urls`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.plugins.urls as _moved
from stepcore.plugins.urls import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
