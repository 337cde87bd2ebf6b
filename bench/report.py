"""Reports derived from a ``bench/run.py`` JSON file: a markdown summary and a PNG chart.

    .venv/bin/python bench/report.py --json results.json --markdown results.md --png results.png

Everything here reads the JSON only, so a report can be regenerated from old results.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: bench/ is sys.path[0], the repository is its parent
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import dataplane_report

OPS = ("add", "check", "del")
REFERENCE = "reference-exec"
FLOOR = "floor"  # bench/floor.py: the chain's kernel objects by the fewest raw pyroute2/libnftables calls


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _ms(value: float) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _backends(doc: dict[str, Any]) -> list[str]:
    ran = {row["backend"] for row in doc["rows"]}
    return [b for b in [*doc["config"]["backends"], FLOOR] if b in ran]


def _latency(doc: dict[str, Any]) -> list[str]:
    rows = {(r["backend"], r["n"], r["op"]): r for r in doc["rows"]}
    reference = doc["config"].get("reference_backend", REFERENCE)
    floored = any(r["backend"] == FLOOR for r in doc["rows"])
    out = [
        "## Latency per container (ms)",
        "",
        "Each sample is one call of the whole chain for one container (`time.perf_counter`). "
        f"`×ref` = p50 / p50 of {reference} at the same N and op (< 1 is faster). "
        + (
            "`×floor` = p50 / p50 of `floor` at the same N and op: the same kernel objects for one container "
            "made with the fewest raw pyroute2/libnftables calls in the same run (bench/floor.py). "
            if floored
            else ""
        )
        + (
            f"Each cell added and deleted its N containers {rounds} times, the samples of every round pooled "
            "(CHECK in the last round only). "
            if (rounds := doc["config"].get("rounds", 1)) > 1
            else ""
        )
        + "With fewer than 100 samples p99 is close to the maximum.",
        "",
    ]
    body = []
    for op in OPS:
        for n in sorted({r["n"] for r in doc["rows"]}):
            ref, floor = rows.get((reference, n, op)), rows.get((FLOOR, n, op))
            for backend in _backends(doc):
                row = rows.get((backend, n, op))
                if row is None:
                    continue
                ratio = f"{row['p50_ms'] / ref['p50_ms']:.2f}×" if ref and backend != reference else ""
                over = f"{row['p50_ms'] / floor['p50_ms']:.2f}×" if floor and backend != FLOOR else ""
                errors = f"{row['errors']}/{len(row['samples'])}" if row["errors"] else ""
                p50, p90, p99 = (_ms(row[k]) for k in ("p50_ms", "p90_ms", "p99_ms"))
                body.append((op, n, backend, p50, p90, p99, ratio, *([over] if floored else []), errors))
    header = ("op", "N", "backend", "p50", "p90", "p99", "×ref", *(["×floor"] if floored else []), "errors")
    out += _table(header, body)
    failed = [r for r in doc["rows"] if r["errors"]]
    if failed:
        out += ["Errors (count, first message):", ""]
        out += [f"- {r['backend']} n={r['n']} {r['op']}: {r['errors']} — `{r['first_error']}`" for r in failed]
        out.append("")
    return out


def _rules(doc: dict[str, Any]) -> list[str]:
    if not doc["cells"]:
        return []
    out = [
        "## Firewall state and first-packet cost",
        "",
        "Counted in the host namespace after all ADDs (nftables JSON `list ruleset`, which includes "
        "iptables-nft's tables; iptables = `-A` lines of iptables-save + ip6tables-save) and after all DELs. "
        "First packet = rules evaluated on the NAT prerouting path by a new TCP connection from outside "
        "to the last container's host port (a static walk of the ruleset; map/set lookups in brackets); "
        "`ok` = the walk reached the DNAT to that container.",
        "",
    ]
    body = []
    for cell in sorted(doc["cells"], key=lambda c: (c["n"], _backends(doc).index(c["backend"]))):
        add, dele, fp = cell["rules_after_add"], cell["rules_after_del"], cell["first_packet"]
        walk = fp.get("error") or f"{fp['rules_evaluated']} [{fp['lookups']}] {'ok' if fp['ok'] else 'WRONG'}"
        body.append(
            (
                cell["n"],
                cell["backend"],
                add["nft_rules"],
                add["nft_elements"],
                add["iptables_rules"] + add["ip6tables_rules"],
                walk,
                dele["nft_rules"],
                dele["nft_elements"],
                dele["iptables_rules"] + dele["ip6tables_rules"],
                "yes" if cell["distinct_addresses"] else "NO",
            )
        )
    header = (
        "N",
        "backend",
        "nft rules",
        "set/map elems",
        "iptables rules",
        "first packet",
        "nft rules after DEL",
        "elems after DEL",
        "iptables after DEL",
        "distinct addrs",
    )
    return out + _table(header, body)


def _shim(doc: dict[str, Any]) -> list[str]:
    s = doc.get("shim") or {}
    if not s:
        return []
    body = [
        ("start-up: exec → first byte at the socket", s["startup"]),
        ("VERSION round trip through the daemon", s["version_round_trip"]),
        *(
            [("the interpreter alone: `-IS -c pass`, exec → exit", s["bare_interpreter"])]
            if "bare_interpreter" in s
            else []
        ),
    ]
    return [
        "## The shim on its own (pycni-daemon)",
        "",
        f"{s['samples']} execs each of the installed `bridge` shim, no `nsenter` or shell in between.",
        "",
        *_table(
            ("", "p50 ms", "p90 ms", "p99 ms"),
            [(k, _ms(v["p50_ms"]), _ms(v["p90_ms"]), _ms(v["p99_ms"])) for k, v in body],
        ),
    ]


def _overhead(doc: dict[str, Any]) -> list[str]:
    o = doc.get("overhead") or {}
    if not o:
        return []
    out = ["## Runtime overhead", ""]
    if "skipped" in o or "error" in o:
        return out + [f"Not measured: {o.get('skipped') or o.get('error')}", ""]
    out.append(
        f"Exec path, reference plugins: {o['samples']} ADDs through pycni's runtime vs the summed "
        "`pycni.sdk.invoke.raw_exec` time of the same plugin binaries with the same stdin and env, from a thread "
        "already in the same host namespace (a separate run, so per-sample differences carry exec noise). "
        "`accounted` = the runtime's call minus the time inside its backend's calls of the *same* call: the "
        "runtime's own work (config and requests, entering and leaving the host namespace per plugin call, "
        "result parsing, locks, the cache write with its two fsyncs), free of that noise. For the in-process "
        "backend the same accounting covers everything outside the plugins' own calls."
    )
    out.append("")
    labels = [
        ("exec: runtime ADD", o["runtime_add"]),
        ("exec: raw exec sum", o["raw_exec_sum"]),
        ("exec: overhead = runtime − raw", o["overhead"]),
        ("exec: accounted ADD", o["accounted"]),
        ("exec: accounted DEL", o["del_accounted"]),
    ]
    if "inprocess" in o:
        inp = o["inprocess"]
        labels += [
            ("in-process: ADD", inp["add"]),
            ("in-process: accounted ADD", inp["add_accounted"]),
            ("in-process: DEL", inp["del"]),
            ("in-process: accounted DEL", inp["del_accounted"]),
        ]
    body = [(label, _ms(v["p50_ms"]), _ms(v["p90_ms"]), _ms(v["p99_ms"])) for label, v in labels]
    out += _table(("", "p50 ms", "p90 ms", "p99 ms"), body)
    per = ", ".join(f"{t} {_ms(v)}" for t, v in o["raw_exec_p50_ms_by_plugin"].items())
    return out + [f"Raw exec p50 per plugin (ms): {per}.", ""]


def _concurrency(doc: dict[str, Any]) -> list[str]:
    if not doc["concurrency"]:
        return []
    out = [
        "## Concurrency",
        "",
        "ADD (then DEL) of the same containers from W threads sharing one runtime; throughput = successful "
        "calls / wall time.",
        "",
    ]
    body = []
    for r in doc["concurrency"]:
        add, dele = r["add"], r["del"]
        body.append(
            (
                r["backend"],
                r["containers"],
                r["workers"],
                f"{add['throughput_per_s']:.1f}",
                _ms(add["p50_ms"]),
                _ms(add["p99_ms"]),
                add["errors"],
                "yes" if add["distinct_addresses"] else "NO",
                f"{dele['throughput_per_s']:.1f}",
                dele["errors"],
            )
        )
    header = (
        "backend",
        "containers",
        "workers",
        "ADD/s",
        "ADD p50 ms",
        "ADD p99 ms",
        "ADD errors",
        "distinct addrs",
        "DEL/s",
        "DEL errors",
    )
    out += _table(header, body)
    errors = [
        f"- {r['backend']} W={r['workers']} {op}: `{r[op]['first_error']}`"
        for r in doc["concurrency"]
        for op in ("add", "del")
        if r[op]["errors"]
    ]
    return out + (errors + [""] if errors else [])


def _memory(doc: dict[str, Any]) -> list[str]:
    if not doc["memory"]:
        return []
    out = [
        "## Memory",
        "",
        "A fresh interpreter per backend ADDs the containers; VmHWM = its peak RSS (n=0: after imports, "
        "before the first ADD), largest child = `ru_maxrss` of its biggest exec'd process, daemon = the "
        "VmHWM of the `pycni serve` a daemon backend talks to.",
        "",
    ]
    body = []
    for m in doc["memory"]:
        if "error" in m:
            body.append((m["backend"], "–", m["error"], "", "", "", ""))
            continue
        for p in m["points"]:
            body.append(
                (
                    m["backend"],
                    p["n"],
                    f"{p['vm_hwm_kib'] / 1024:.1f}",
                    f"{p['vm_rss_kib'] / 1024:.1f}",
                    f"{p['children_maxrss_kib'] / 1024:.1f}",
                    f"{p['daemon_vm_hwm_kib'] / 1024:.1f}" if "daemon_vm_hwm_kib" in p else "",
                    m["errors"] if p is m["points"][-1] and m["errors"] else "",
                )
            )
    header = ("backend", "N", "VmHWM MiB", "VmRSS MiB", "largest child MiB", "daemon VmHWM MiB", "ADD errors")
    return out + _table(header, body)


def _parsing(doc: dict[str, Any]) -> list[str]:
    if not doc["parsing"]:
        return []
    out = [
        "## Result parsing (per second, one core)",
        "",
        "The same bridge-like result encoded per spec version; floor = `json.loads` of the same bytes.",
        "",
    ]
    body = [
        (
            r["version"],
            r["bytes"],
            f"{r['json_loads_per_s']:,}",
            f"{r['parse_per_s']:,}",
            f"{r['parse_convert_per_s']:,}",
            f"{r['parse_convert_vs_json_loads']:.1f}×",
        )
        for r in doc["parsing"]
    ]
    header = ("version", "bytes", "json.loads", "parse_result", "parse + convert to 1.1.0", "cost vs json.loads")
    return out + _table(header, body)


def _dataplane(doc: dict[str, Any]) -> list[str]:
    return dataplane_report.section(doc, _table)


def _steps(doc: dict[str, Any]) -> list[str]:
    st = doc.get("steps") or {}
    if not st.get("points"):
        return []
    points = st["points"]
    out = [
        "## Where an in-process ADD's time goes, per N (steps)",
        "",
        f"The last {st['window']} ADDs before each N (or N/2 when smaller), every kernel request timed where it "
        "leaves Python (wall time: the kernel's work plus the bindings' own message handling, which does not "
        "depend on N). `python` = the rest of the ADD (plugins, runtime). ms per ADD (calls per ADD).",
        "",
    ]
    labels = [row["step"] for row in st["growth"] if row["step"] not in ("python_ms_per_add", "add_mean_ms")]
    labels = labels or list(points[-1]["steps"])
    body = []
    for label in labels:
        cells = []
        for p in points:
            step = p["steps"].get(label)
            cells.append(f"{step['ms_per_add']:.3f} ({step['calls_per_add']:g})" if step else "–")
        body.append((label, *cells))
    body.append(("kernel requests, total", *(f"{p['kernel_ms_per_add']:.2f}" for p in points)))
    body.append(("python", *(f"{p['python_ms_per_add']:.2f}" for p in points)))
    body.append(("ADD mean", *(f"{p['add_mean_ms']:.2f}" for p in points)))
    body.append(("ADD p50", *(f"{p['add']['p50_ms']:.2f}" for p in points)))
    return out + _table(("step", *(f"N={p['n']}" for p in points)), body)


def _warmup(doc: dict[str, Any]) -> list[str]:
    if not doc["warmup"]:
        return []
    out = ["## Warm-up cells (1 container, first use of each backend in the run; not in the tables above)", ""]
    body = [(r["backend"], r["op"], _ms(r["p50_ms"]), r["errors"] or "") for r in doc["warmup"]]
    return out + _table(("backend", "op", "ms", "errors"), body)


def _header(doc: dict[str, Any]) -> list[str]:
    m, c = doc["machine"], doc["config"]
    debs = m.get("debian_packages", {})
    load_start = ", ".join(f"{x:.2f}" for x in m.get("loadavg", []))
    load_end = ", ".join(f"{x:.2f}" for x in doc.get("loadavg_at_end", []))
    out = [
        f"# pycni benchmark {doc['run_id']} ({doc['started']})",
        "",
        f"- Machine: {m.get('cpu_model')} × {m.get('cores')} cores, {m.get('memory_mib')} MiB,"
        f" kernel {m.get('kernel')}, {m.get('os')}; load average {load_start} at start, {load_end} at end",
        f"- Python {m.get('python')}, pycni {m.get('pycni')} (git {str(m.get('pycni_git', {}).get('commit'))[:12]}"
        f"{' dirty' if m.get('pycni_git', {}).get('dirty') else ''}), pyroute2 {m.get('pyroute2')},"
        f" libnftables {debs.get('libnftables1')}, {m.get('iptables')}",
        f"- Reference plugins: containernetworking-plugins {debs.get('containernetworking-plugins')};"
        f" netavark {m.get('netavark')}",
        _workload(c),
        f"- N: {c['n']}; backends: {', '.join(c['backends'])}; wall time {doc.get('wall_s')} s",
    ]
    out += [f"- Skipped {name}: {why}" for name, why in doc["skipped"].items()]
    out += [
        f"- Merged in from run {part['run_id']} ({part['started']}, git {part['commit'][:12]}): {part['what']}"
        for part in doc.get("merged_from", [])
    ]
    if doc.get("interrupted"):
        out.append("- **Interrupted**: partial results")
    if doc.get("error"):
        out.append("- **Failed**: see `error` in the JSON")
    return out + [""]


def _workload(c: dict[str, Any]) -> str:
    cells = " N containers per cell, each in its own namespace, all in one throwaway host namespace per cell"
    ports = f"({c['host_port_base']}+i → {c['container_port']}/tcp)"
    if c.get("conflist"):
        return (
            f"- Workload: {c['conflist']} ({' → '.join(c['chain'])}, cniVersion {c['cni_version']}, first range"
            f" {c['subnet']}), exec'd from {c['plugin_dir']}; one port mapping per container {ports} where a plugin"
            f" declares portMappings; IPAM dataDir moved into each cell;" + cells
        )
    return (
        f"- Workload: {' → '.join(c['chain'])} (cniVersion {c['cni_version']}), bridge + host-local {c['subnet']},"
        f" ipMasq, isGateway, one port mapping per container {ports};" + cells
    )


def _cleanup(doc: dict[str, Any]) -> list[str]:
    cleanup = doc.get("cleanup", {})
    swept = cleanup.get("swept_namespaces") or []
    return [
        f"Cleanup: temp dir removed: {cleanup.get('temp_root_removed')}; namespaces the final sweep had to remove:"
        f" {len(swept)}.",
        "",
    ]


CAVEATS = (
    "The reference portmap 1.1.1 fails every CHECK (it looks for an IPv6 DNAT chain it never made), so its "
    "CHECK rows time a failing CHECK.",
    "The reference portmap 1.1.1 checks for its CNI-HOSTPORT-DNAT chain, then creates it: when the first ADDs "
    "on a fresh host run concurrently, the loser of that race fails with `CHAIN_USER_ADD failed (File exists)`; "
    "such errors in its concurrency rows are that upstream race.",
    "netavark 1.4 has no CHECK and no IPAM (Podman allocates): each container gets the address host-local would "
    "give it. Its forwarding rules are per network (two FORWARD accepts for the subnet), not per container "
    "as the firewall plugin's, and its per-network DNAT chain holds every container's rules, which is why its "
    "first packet walks ~4 rules per container. Its last teardown also deletes the bridge.",
    "pycni's link deletion returns once the kernel announces the link gone (RTM_DELLINK) and leaves the "
    "acknowledgement, which waits for an RCU grace period, to a helper thread; the reference plugins wait for it.",
    "Each cell destroys its namespaces when it ends; the kernel finishes that work in the background, so a "
    "cell that follows a large one can be slowed by it (the rotation spreads this over the backends).",
)


def _caveats(doc: dict[str, Any]) -> list[str]:
    return ["## Caveats", "", *(f"- {c}" for c in CAVEATS), ""]


def markdown(doc: dict[str, Any]) -> str:
    parts = (
        _header,
        _latency,
        _shim,
        _rules,
        _overhead,
        _concurrency,
        _memory,
        _steps,
        _dataplane,
        _parsing,
        _warmup,
        _caveats,
        _cleanup,
    )
    return "\n".join(line for part in parts for line in part(doc))


def png(doc: dict[str, Any], path: str) -> None:
    """p50 latency vs N per backend, one panel per op, log-log (the band reaches up to p90); then,
    when the run has them, the data plane's rates vs N (median, band min–max) and the steps' ms
    per ADD vs N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [op for op in OPS if any(r["op"] == op for r in doc["rows"])]
    kinds = [k for k in dataplane_report.KINDS if any(k[0] in r for r in doc.get("dataplane") or [])]
    steps = 1 if (doc.get("steps") or {}).get("points") else 0
    panels = len(ops) + len(kinds) + steps
    cols = min(3, max(1, panels))
    rows_ = math.ceil(max(1, panels) / cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(5 * cols, 4.5 * rows_), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[panels:]:
        ax.set_visible(False)
    for ax, op in zip(flat, ops):
        for backend in _backends(doc):
            rows = sorted((r for r in doc["rows"] if r["backend"] == backend and r["op"] == op), key=lambda r: r["n"])
            if not rows:
                continue
            ns = [r["n"] for r in rows]
            (line,) = ax.plot(ns, [r["p50_ms"] for r in rows], marker="o", label=backend)
            ax.fill_between(
                ns, [r["p50_ms"] for r in rows], [r["p90_ms"] for r in rows], color=line.get_color(), alpha=0.15
            )
        _axes(ax, op.upper(), "ms per container (p50, band to p90)", log_y=True)
    for ax, (kind, key, title) in zip(flat[len(ops) :], kinds):
        for backend in dict.fromkeys(r["backend"] for r in doc["dataplane"]):
            rows = sorted((r for r in doc["dataplane"] if r["backend"] == backend and kind in r), key=lambda r: r["n"])
            scale = 1e9 if key == "bits_per_s" else 1.0
            ns, mid = [r["n"] for r in rows], [r[kind][key] / scale for r in rows]
            (line,) = ax.plot(ns, mid, marker="o", label=backend)
            if all("min" in r[kind] for r in rows):  # the runs' range as a band
                low, high = ([r[kind][k] / scale for r in rows] for k in ("min", "max"))
                ax.fill_between(ns, low, high, color=line.get_color(), alpha=0.15)
        _axes(
            ax,
            title.format(dir=dataplane_report.direction(doc)),
            "Gbit/s" if key == "bits_per_s" else "conn/s",
            log_y=False,
        )
        ax.set_ylim(bottom=0)
    if steps:
        ax = flat[panels - 1]
        points = doc["steps"]["points"]
        ns = [p["n"] for p in points]
        top = [r["step"] for r in doc["steps"]["growth"] if r["step"] not in ("add_mean_ms", "python_ms_per_add")][:6]
        for label in top:
            ax.plot(ns, [p["steps"].get(label, {}).get("ms_per_add", 0.0) for p in points], marker="o", label=label)
        ax.plot(ns, [p["python_ms_per_add"] for p in points], marker="s", linestyle="--", label="python (the rest)")
        _axes(ax, "in-process ADD: kernel requests per N", "ms per ADD", log_y=False)
        ax.set_ylim(bottom=0)
    m = doc["machine"]
    fig.suptitle(
        f"pycni bench {doc['run_id']}: {m.get('cpu_model')} × {m.get('cores')}, kernel {m.get('kernel')}",
        fontsize="small",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _axes(ax: Any, title: str, ylabel: str, *, log_y: bool) -> None:
    ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.set_title(title, fontsize="medium")
    ax.set_xlabel("containers (N)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Markdown and PNG reports from bench/run.py JSON.")
    p.add_argument("--json", required=True, metavar="PATH", help="results written by bench/run.py --json")
    p.add_argument("--markdown", metavar="OUT.md")
    p.add_argument("--png", metavar="OUT.png")
    args = p.parse_args(argv)
    doc = json.loads(Path(args.json).read_text())
    text = markdown(doc)
    if args.markdown:
        Path(args.markdown).write_text(text)
    else:
        print(text)
    if args.png:
        png(doc, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
