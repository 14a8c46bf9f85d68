"""`stepcore.models` is now `stepcore.store.models`.

This path keeps working: it is the same module.
"""

import sys

import stepcore.store.models as _moved
from stepcore.store.models import *  # noqa: F403  (for type checkers)

sys.modules[__name__] = _moved
