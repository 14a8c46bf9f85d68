"""`stepcore.fileio` is now `stepcore.engine.fileio`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.engine.fileio as _moved
from stepcore.engine.fileio import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
