"""The old name of :mod:`inline_attn.dense.seg_task` (the segmentation hooks of the dense training
loop), kept so that ``inline_attn.dense.engine`` still imports.

This module replaces itself with :mod:`~inline_attn.dense.seg_task` in ``sys.modules``: both names
are the same module object, so every name (private ones included) is there, and monkeypatching one
patches the other.
"""

import sys

from . import seg_task

sys.modules[__name__] = seg_task
