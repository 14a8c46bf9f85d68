"""`stepcore.run_writer` is now `stepcore.capability.run_writer`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.capability.run_writer as _moved
from stepcore.capability.run_writer import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
