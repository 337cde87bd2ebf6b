"""The first published path of :mod:`pycni.testing.strategies` (``from pycni import strategies``),
kept so code written against it runs unchanged: the same objects, nothing of its own."""

from __future__ import annotations

from .testing.strategies import *  # noqa: F403
from .testing.strategies import __all__ as __all__
