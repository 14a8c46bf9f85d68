"""`stepcore.writes` is now `stepcore.store.writes`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.store.writes as _moved
from stepcore.store.writes import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
