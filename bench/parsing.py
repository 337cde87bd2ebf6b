"""Result parsing throughput, for people fuzzing or replaying plugin output.

For each spec version, the same bridge-like result (three interfaces, one address with its
gateway, a default route, DNS) encoded as that version emits it, measured three ways:
``json.loads`` (the floor: decoding only), :func:`pycni.types.parse_result` (decode + validate
into the version's model), and ``parse_result`` + :func:`pycni.types.convert` to 1.1.0. The
rate is the best of three repeats (the least disturbed by other load), each about ``seconds``.
"""

from __future__ import annotations

import json
import timeit
from collections.abc import Callable
from functools import partial
from typing import Any

from pycni.types import Result, convert, parse_result
from pycni.version import SUPPORTED

REPEATS = 3
_CURRENT: dict[str, Any] = {
    "cniVersion": "1.1.0",
    "interfaces": [
        {"name": "pcbench0", "mac": "6e:11:22:33:44:55"},
        {"name": "veth1a2b3c4d", "mac": "72:aa:bb:cc:dd:ee"},
        {"name": "eth0", "mac": "0a:58:c6:12:00:05", "sandbox": "/run/netns/pycni-bench-x-c3"},
    ],
    "ips": [{"address": "198.18.0.5/16", "gateway": "198.18.0.1", "interface": 2}],
    "routes": [{"dst": "0.0.0.0/0", "gw": "198.18.0.1"}],
    "dns": {"nameservers": ["198.18.0.1"], "domain": "bench.local", "search": ["bench.local"]},
}


def sample(version: str) -> bytes:
    """The sample result as a plugin speaking ``version`` would print it."""
    return json.dumps(convert(Result.from_json(_CURRENT), version).to_json()).encode()


def _rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second: the best of ``REPEATS`` runs of about ``seconds`` each."""
    timer = timeit.Timer(fn)
    number = 1
    while (elapsed := timer.timeit(number)) < 0.01:
        number *= 2
    number = max(1, int(number * seconds / elapsed))
    return number / min(timer.repeat(REPEATS, number))


def _parse_and_convert(data: bytes) -> object:
    return convert(parse_result(data), "1.1.0")


def measure(seconds: float) -> list[dict[str, Any]]:
    rows = []
    for version in SUPPORTED:
        data = sample(version)
        floor = _rate(partial(json.loads, data), seconds)
        parsed = _rate(partial(parse_result, data), seconds)
        converted = _rate(partial(_parse_and_convert, data), seconds)
        rows.append(
            {
                "version": version,
                "bytes": len(data),
                "json_loads_per_s": round(floor),
                "parse_per_s": round(parsed),
                "parse_convert_per_s": round(converted),
                "parse_convert_vs_json_loads": round(floor / converted, 2),
            }
        )
    return rows
