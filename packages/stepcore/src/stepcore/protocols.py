"""`stepcore.protocols` is now `stepcore.store.protocols`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.store.protocols as _moved
from stepcore.store.protocols import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
