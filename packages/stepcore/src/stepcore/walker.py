"""`stepcore.walker` is now `stepcore.media.walker`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.media.walker as _moved
from stepcore.media.walker import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
