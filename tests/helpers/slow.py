"""Timeouts for a loaded machine: every bounded wait of the suite (for DAD, a route, a peer
answering, a failpoint reached) is multiplied by ``PYCNI_TEST_SLOW`` (default 1), which CI or a
developer sharing the machine may raise. Waits poll their condition, so a larger factor costs
time only when something is really wrong."""

from __future__ import annotations

import os

__all__ = ["SLOW", "scaled"]

SLOW = float(os.environ.get("PYCNI_TEST_SLOW") or 1)


def scaled(seconds: float) -> float:
    return seconds * SLOW
