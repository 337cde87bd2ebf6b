"""The chain plugin and the folded form of a network list: one exec per network.

An exec'ing runtime starts one process per plugin of a list. A *folded* list has one plugin,
``pycni-chain``, whose config carries the real list; the chain plugin (:mod:`.plugin`) runs it
with the runtime's semantics in one call — in ``pycni serve``, in one request. :mod:`.fold`
writes the folded form of a conflist and back.
"""

from __future__ import annotations

from .fold import fold, is_folded, unfold
from .plugin import BEST_EFFORT_DEL_KEY, CHAIN_TYPE, ChainPlugin

__all__ = ["BEST_EFFORT_DEL_KEY", "CHAIN_TYPE", "ChainPlugin", "fold", "is_folded", "unfold"]
