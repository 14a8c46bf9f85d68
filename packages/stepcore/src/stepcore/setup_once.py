"""`stepcore.setup_once` is now `stepcore.engine.setup_once`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.engine.setup_once as _moved
from stepcore.engine.setup_once import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
