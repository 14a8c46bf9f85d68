"""`stepcore.worker` is now `stepcore.engine.worker`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.engine.worker as _moved
from stepcore.engine.worker import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
