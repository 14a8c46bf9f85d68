"""`stepcore.encryption` is now `stepcore.engine.encryption`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.engine.encryption as _moved
from stepcore.engine.encryption import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
