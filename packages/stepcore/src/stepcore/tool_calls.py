"""`stepcore.tool_calls` is now `stepcore.capability.tool_calls`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.capability.tool_calls as _moved
from stepcore.capability.tool_calls import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
