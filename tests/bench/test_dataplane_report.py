"""The data-plane report (bench/dataplane_report.py): medians with their range, and comparisons
of cells measured interleaved taken round by round."""

from __future__ import annotations

from typing import Any

from bench import report
from bench.dataplane_report import section


def _row(
    backend: str, n: int, group: str | None, host_port: list[float], gbit: list[float], cpu: float = 50.0
) -> dict[str, Any]:
    def spread(values: list[float], key: str) -> dict[str, Any]:
        mid = sorted(values)[(len(values) - 1) // 2]
        return {key: mid, "runs": values, "min": min(values), "max": max(values)}

    cpu_runs = [cpu * 0.8, cpu, cpu * 1.2][: len(host_port)]

    return {
        "backend": backend,
        "n": n,
        "group": group,
        "seconds": 3.0,
        "workers": 2,
        "repeat": len(host_port),
        "host_port": {**spread(host_port, "per_s"), "cpu_us_per_conn": spread(cpu_runs, "median")},
        "c2c_conn": spread(host_port, "per_s"),
        "c2c_throughput": {
            **spread([g * 1e9 for g in gbit], "bits_per_s"),
            "cpu_ms_per_gbit": spread([c * 4 for c in cpu_runs], "median"),
        },
        "first_packet_rules": 3,
        "rules": {"nft_rules": 17},
        "bridge_nf_call_iptables": 1,
        "from": "198.18.0.3",
    }


def _lines(rows: list[dict[str, Any]]) -> list[str]:
    return section({"dataplane": rows}, report._table)


def test_rates_show_their_median_and_range() -> None:
    text = "\n".join(_lines([_row("pycni-inprocess", 10, "g", [1000.0, 3000.0, 2000.0], [4.0, 5.0, 6.0])]))
    assert "| pycni-inprocess | 10 | 2,000 [1,000–3,000] (1.00" in text
    assert "5.00 [4.00–6.00]" in text and "50.0 [40.0–60.0]" in text


def test_cells_of_one_group_are_compared_round_by_round() -> None:
    # load halves both cells' second round: per round the ratio is 0.5 every time
    go = _row("reference-exec", 1000, "g", [2000.0, 1000.0, 2000.0], [4.0, 2.0, 4.0], cpu=50.0)
    ours = _row("pycni-inprocess", 1000, "g", [1000.0, 500.0, 1000.0], [4.0, 2.0, 4.0], cpu=25.0)
    text = "\n".join(_lines([go, ours]))
    expected = "| 0.50 [0.50–0.50] | 0.50 [0.50–0.50] | 1.00 [1.00–1.00] | 0.50 [0.50–0.50] | 0.50 [0.50–0.50] |"
    assert f"| pycni-inprocess | 1000 {expected}" in text


def test_cells_of_different_groups_are_compared_by_their_medians() -> None:
    go = _row("reference-exec", 1000, "a", [2000.0, 1000.0, 2000.0], [4.0, 2.0, 4.0])
    ours = _row("pycni-inprocess", 1000, "b", [1000.0, 500.0, 1000.0], [2.0, 4.0, 4.0])
    assert "| pycni-inprocess | 1000 | 0.50 | 0.50 | 1.00 | 1.00 | 1.00 |" in "\n".join(_lines([go, ours]))


def test_runs_without_a_spread_still_report() -> None:
    old = _row("pycni-inprocess", 10, None, [1000.0], [4.0])
    for kind in ("host_port", "c2c_conn", "c2c_throughput"):
        for key in ("min", "max", "runs", "cpu_us_per_conn", "cpu_ms_per_gbit"):
            old[kind].pop(key, None)
    text = "\n".join(_lines([old]))
    assert "| pycni-inprocess | 10 | 1,000 (1.00×N₀) |" in text
