"""`stepcore.content_tracker` is now `stepcore.capability.content_tracker`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.capability.content_tracker as _moved
from stepcore.capability.content_tracker import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
