"""`stepcore.options` is now `stepcore.plugins.options`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.plugins.options as _moved
from stepcore.plugins.options import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
