"""`stepcore.lifecycle` is now `stepcore.store.lifecycle`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.store.lifecycle as _moved
from stepcore.store.lifecycle import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
