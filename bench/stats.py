"""Percentiles and summaries (milliseconds in, milliseconds out)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default): with fewer than 100
    samples p99 lies between the two largest, i.e. it is close to the maximum."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(samples: Sequence[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(samples, 50), 3),
        "p90_ms": round(percentile(samples, 90), 3),
        "p99_ms": round(percentile(samples, 99), 3),
        "mean_ms": round(sum(samples) / len(samples), 3) if samples else math.nan,
        "min_ms": round(min(samples), 3) if samples else math.nan,
        "max_ms": round(max(samples), 3) if samples else math.nan,
    }
