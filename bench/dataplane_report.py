"""The data-plane section of the markdown report (rows of ``bench/dataplane.py``, JSON only).

Each rate is the median of the cell's runs with their range, ``[min–max]``, so a difference can
be read against the spread. When two cells were measured in the same group (interleaved rounds:
``runs[i]`` of both taken in round ``i``), their comparison is the median of the per-round
ratios, with its range: the machine's load moves both runs of a round alike, so these ratios
are far steadier than a ratio of medians taken minutes apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["KINDS", "direction", "section"]

REFERENCE = "reference-exec"
KINDS = (
    ("host_port", "per_s", "conn/s to a host port (outside → DNAT → last container)"),
    ("c2c_conn", "per_s", "conn/s container {dir} across the bridge"),
    ("c2c_throughput", "bits_per_s", "throughput container {dir} (iperf3)"),
)
_FORMAT = {"per_s": (1.0, "{:,.0f}"), "bits_per_s": (1e9, "{:.2f}")}

Table = Callable[[Sequence[str], Iterable[Sequence[Any]]], list[str]]


def direction(doc: dict[str, Any]) -> str:
    """Container to container as the run measured it: N-1 → 0 (the newest as client) since the
    section's second version; the first measured 0 → N-1 (its rows' ``from`` is container 0's .2)."""
    rows = [r for r in doc.get("dataplane") or [] if "from" in r and r["n"] > 2]
    return "0 → N-1" if rows and rows[0]["from"].endswith(".0.2") else "N-1 → 0"


def _value(m: dict[str, Any], key: str) -> str:
    scale, fmt = _FORMAT[key]
    text = fmt.format(m[key] / scale)
    if "min" in m:  # runs before the spread was kept have only the median
        text += f" [{fmt.format(m['min'] / scale)}–{fmt.format(m['max'] / scale)}]"
    return text


def _ratio(r: dict[str, Any], base: dict[str, Any], kind: str, key: str, cpu: str | None = None) -> str:
    """``r`` over ``base`` (their rates, or with ``cpu`` their CPU times): the per-round ratios'
    median and range when both were measured in the same group, else the medians' ratio."""
    a, b = (row[kind].get(cpu) or {} if cpu else row[kind] for row in (r, base))
    mid_key = "median" if cpu else key
    if mid_key not in a or mid_key not in b:
        return "–"
    if r.get("group") is not None and r.get("group") == base.get("group"):
        ratios = sorted(x / y for x, y in zip(a["runs"], b["runs"]) if y)
        if ratios:
            mid = ratios[(len(ratios) - 1) // 2]
            return f"{mid:.2f} [{ratios[0]:.2f}–{ratios[-1]:.2f}]"
    return f"{a[mid_key] / b[mid_key]:.2f}" if b[mid_key] else "–"


def section(doc: dict[str, Any], table: Table) -> list[str]:
    rows = doc.get("dataplane") or []
    done = [r for r in rows if "error" not in r]
    if not rows:
        return []
    one = done[0] if done else rows[0]
    cpu = any("cpu_us_per_conn" in r["host_port"] for r in done)
    out = [
        "## Data plane",
        "",
        f"Every container ADDed, then for {one.get('seconds', 0):g} s each ({one.get('workers')} generator "
        f"processes; {one.get('repeat', 1)} runs, median [min–max]): new TCP connections per second from an outside "
        "namespace to the last container's published host port (the DNAT path), and from "
        f"container {direction(doc)} across the bridge (bridged traffic traverses the host's "
        f"firewall hooks: `bridge-nf-call-iptables` column); iperf3 TCP throughput container {direction(doc)}. "
        "`×N₀` = the rate / the same backend's rate at the smallest N (per-round ratios when measured "
        "interleaved). First packet = rules the DNAT walk evaluates (see the firewall table)."
        + (
            " `µs CPU` = the generator's CPU time per host-port connection, the kernel's work in its context"
            " included (load-independent, unlike the rate)."
            if cpu
            else ""
        ),
        "",
    ]
    base: dict[str, dict[str, Any]] = {}
    body = []
    for r in sorted(rows, key=lambda r: (r["backend"], r["n"])):
        if "error" in r:
            body.append((r["backend"], r["n"], r["error"], *[""] * (5 + cpu)))
            continue
        first = base.setdefault(r["backend"], r)
        rates = [f"{_value(r[k], key)} ({_ratio(r, first, k, key)}×N₀)" for k, key, _ in KINDS]
        hp_cpu = r["host_port"].get("cpu_us_per_conn")
        extra = [f"{hp_cpu['median']:.1f} [{hp_cpu['min']:.1f}–{hp_cpu['max']:.1f}]" if hp_cpu else "–"] if cpu else []
        body.append(
            (
                r["backend"],
                r["n"],
                *rates,
                *extra,
                r.get("first_packet_rules", "–"),
                r["rules"]["nft_rules"],  # libnftables lists iptables-nft's tables too
                r.get("bridge_nf_call_iptables"),
            )
        )
    header = ["backend", "N", "host-port conn/s", "c2c conn/s", "c2c Gbit/s"]
    header += ["host-port µs CPU"] if cpu else []
    header += ["first packet rules", "rules (nftables, iptables-nft's included)", "bridge-nf-call-iptables"]
    return out + table(header, body) + _against_reference(done, table)


def _against_reference(rows: list[dict[str, Any]], table: Table) -> list[str]:
    """Each backend over the Go chain at the same N (per-round ratios when interleaved)."""
    ref = {r["n"]: r for r in rows if r["backend"] == REFERENCE}
    body = [
        (
            r["backend"],
            r["n"],
            *[_ratio(r, ref[r["n"]], k, key) for k, key, _ in KINDS],
            _ratio(r, ref[r["n"]], "host_port", "per_s", "cpu_us_per_conn"),
            _ratio(r, ref[r["n"]], "c2c_throughput", "bits_per_s", "cpu_ms_per_gbit"),
        )
        for r in sorted(rows, key=lambda r: (r["backend"], r["n"]))
        if r["backend"] != REFERENCE and r["n"] in ref
    ]
    if not body:
        return []
    intro = (
        "Against the Go chain (reference-exec) at the same N: the ratio of the rates, and of the CPU time per "
        "host-port connection and per Gbit of throughput (both ends, the kernel's work in their context included: "
        "< 1 costs less); median [min–max] of the per-round ratios when the cells were measured interleaved "
        "(`--dataplane-group n`), else the medians'."
    )
    header = ("backend", "N", "host-port conn/s", "c2c conn/s", "c2c throughput", "CPU per conn", "CPU per Gbit")
    return [intro, "", *table(header, body)]
