"""Where an in-process ADD's time goes as N grows: every kernel round trip, timed by kind.

One cell of the largest N (``pycni-inprocess``); the containers are ADDed one by one and, for
the last ``window`` ADDs before each checkpoint N, every kernel request the plugins make is
timed where it leaves Python:

* ``netlink <method> <command>``: each pyroute2 ``IPRoute`` request (``link add``, ``route
  add``, ``vlan_filter add`` …), timed at ``kernel.links.call``, and opening/closing an
  ``IPRoute`` socket; ``netlink <request>, …``: each send of ``kernel.batch`` (the hot path's
  requests built without ``IPRoute``), named by the requests in it;
* ``nft <verb> <object>``: each libnftables transaction or listing (``Nftables.cmd`` and
  ``json_cmd``), by its first command, and opening a libnftables context;
* ``nfnetlink <message>``: each raw nfnetlink read (``kernel.nfnl``);
* ``sysctl read|write <path>``: each ``/proc/sys`` access, with interface names as ``*``;
* ``setns``: entering a namespace (the runtime's and the plugins' worker threads).

A step's time is wall time around the call: the kernel's work plus the bindings' Python
(message building and parsing), which is the same at every N, so what grows is the kernel's.
What is left of an ADD (``python``) is the plugins' and the runtime's own code. Only the
outermost timed call counts when one nests in another.
"""

from __future__ import annotations

import contextlib
import functools
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .drivers import FAILURES, RuntimeDriver
from .measure import Progress, _Timed
from .session import Session
from .stats import summarize

_IFNAME = re.compile(r"/conf/[^/]+/")


class Recorder:
    """Accumulates (calls, seconds) per step label while ``on``; outermost calls only."""

    def __init__(self) -> None:
        self.on = False
        self.steps: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        self._depth = threading.local()

    def timed(self, label: Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "n", 0)
            if not self.on or depth:
                return fn(*args, **kwargs)
            self._depth.n = 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self._depth.n = 0
                key = label(*args, **kwargs)
                with self._lock:
                    entry = self.steps.setdefault(key, [0, 0.0])
                    entry[0] += 1
                    entry[1] += elapsed

        return wrapper

    def take(self) -> dict[str, list[float]]:
        with self._lock:
            steps, self.steps = self.steps, {}
        return steps


def _request(method: Any, *args: Any, **kwargs: Any) -> str:
    """``links.call``'s request: pyroute2 0.9's ``ipr.link`` is a partial over the async method."""
    inner = method.args[0] if isinstance(method, functools.partial) and method.args else method
    name = getattr(inner, "__name__", repr(inner))
    first = args[0] if args and isinstance(args[0], str) else ""
    return f"netlink {name} {first}".rstrip()


#: rtnetlink message types (linux/rtnetlink.h) as ``kernel.batch`` sends them.
_BATCHED = {
    16: "link set",
    17: "link del",
    18: "link get",
    20: "addr add",
    22: "addr dump",
    24: "route append",
    26: "route get",
}
_NLM_F_CREATE = 0x400


def _batch(requests: Any) -> str:
    """A ``kernel.batch.Requests.send``: its requests in order, each named once."""
    names: dict[str, None] = {}
    for data in requests._data:
        _, kind, flags = struct.unpack_from("=IHH", data)
        name = _BATCHED.get(kind, f"type {kind}")
        names["link add" if kind == 16 and flags & _NLM_F_CREATE else name] = None
    return "netlink " + ", ".join(names)


def _nft_text(self: object, text: str) -> str:
    words = text.split()
    return "nft " + " ".join(words[:2]) if words else "nft (empty)"


def _nft_json(self: object, root: Any) -> str:
    commands = root.get("nftables", []) if isinstance(root, dict) else []
    if not commands:
        return "nft json (empty)"
    verb, body = next(iter(commands[0].items()))
    kind = next(iter(body), "") if isinstance(body, dict) else ""
    return f"nft {verb} {kind} (json)".replace("  ", " ")


def _sysctl(verb: str) -> Callable[..., str]:
    def label(name: str, *args: Any) -> str:
        return f"sysctl {verb} {_IFNAME.sub('/conf/*/', name)}"

    return label


@contextlib.contextmanager
def instrumented(recorder: Recorder) -> Iterator[None]:
    """Wrap the kernel doors (class and module attributes) for the block, then put them back."""
    import nftables
    from pyroute2 import IPRoute

    from pycni import netns
    from pycni_plugins.kernel import addressing, batch, conntrack, links, nfnl, routing, sysctl

    # ``call`` is looked up as a global of each module that imported it by name.
    patches: list[tuple[Any, str, Callable[..., str]]] = [
        (module, "call", _request) for module in (links, addressing, routing, conntrack)
    ]
    patches += [
        (batch.Requests, "send", _batch),
        (IPRoute, "__init__", lambda *a, **k: "netlink socket open"),
        (IPRoute, "close", lambda *a, **k: "netlink socket close"),
        (nftables.Nftables, "__init__", lambda *a, **k: "nft context open"),
        (nftables.Nftables, "cmd", _nft_text),
        (nftables.Nftables, "json_cmd", _nft_json),
        (nfnl.Reader, "_get", lambda self, msg, *a, **k: f"nfnetlink {type(msg).__name__}"),
        (sysctl, "read", _sysctl("read")),
        (sysctl, "write", _sysctl("write")),
        (netns, "_setns", lambda *a, **k: "setns"),
    ]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches if name in owner.__dict__]
    try:
        for owner, name, label in patches:
            setattr(owner, name, recorder.timed(label, getattr(owner, name)))
        yield
    finally:
        for owner, name, _ in patches:
            if name in owner.__dict__:
                delattr(owner, name)
        for owner, name, original in saved:
            setattr(owner, name, original)


def measure(checkpoints: list[int], window: int, session: Session, progress: Progress) -> dict[str, Any]:
    """Per-step kernel timings of the in-process ADDs just before each checkpoint N."""
    from pycni.backends import InProcessBackend

    n = max(checkpoints)
    recorder = Recorder()
    timed = _Timed(InProcessBackend())
    points = []
    with session.cell("steps-inprocess", n) as cell, instrumented(recorder):
        driver = RuntimeDriver(cell, path=[], backend=timed)
        wanted = {c: range(c - min(window, max(1, c // 2)), c) for c in checkpoints}
        walls: list[float] = []
        plugins: dict[str, float] = {}
        errors = 0
        for i in range(n):
            measured = any(i in r for r in wanted.values())
            recorder.on = measured
            timed.calls.clear()
            start = time.perf_counter()
            try:
                driver.add(i)
            except FAILURES:
                errors += 1
            wall = time.perf_counter() - start
            recorder.on = False
            if measured:
                walls.append(wall * 1000)
                for plugin_type, _, ms in timed.calls:
                    plugins[plugin_type] = plugins.get(plugin_type, 0.0) + ms
            if i + 1 in wanted:
                points.append(_point(i + 1, walls, plugins, recorder.take(), errors))
                walls, plugins, errors = [], {}, 0
                p = points[-1]
                progress.line(
                    f"    steps n={i + 1:<5} ADD p50 {p['add']['p50_ms']:.1f} ms over {p['adds']} ADDs;"
                    f" kernel steps {p['kernel_ms_per_add']:.2f} ms, Python {p['python_ms_per_add']:.2f} ms per ADD"
                )
            progress.tick("steps (in-process ADD)", i + 1, n)
    return {"backend": "pycni-inprocess", "window": window, "points": points, "growth": _growth(points)}


def _point(
    n: int, walls: list[float], plugins: dict[str, float], steps: dict[str, list[float]], errors: int
) -> dict[str, Any]:
    adds = len(walls)
    per_add = {
        label: {
            "calls_per_add": round(c / adds, 2),
            "ms_per_add": round(s * 1000 / adds, 3),
            "ms_per_call": round(s * 1000 / c, 3),
        }
        for label, (c, s) in sorted(steps.items(), key=lambda kv: -kv[1][1])
    }
    kernel = sum(s for _, s in steps.values()) * 1000 / adds
    mean = sum(walls) / adds
    return {
        "n": n,
        "adds": adds,
        "errors": errors,
        "add": summarize(walls),
        "add_mean_ms": round(mean, 3),
        "plugins_ms_per_add": {t: round(ms / adds, 3) for t, ms in plugins.items()},
        "kernel_ms_per_add": round(kernel, 3),
        "python_ms_per_add": round(mean - kernel, 3),
        "steps": per_add,
    }


def _growth(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each step's ms per ADD at the largest N against the smallest, largest absolute growth first."""
    if len(points) < 2:
        return []
    low, high = points[0], points[-1]
    rows = []
    for label in dict.fromkeys([*low["steps"], *high["steps"]]):
        a = low["steps"].get(label, {}).get("ms_per_add", 0.0)
        b = high["steps"].get(label, {}).get("ms_per_add", 0.0)
        rows.append(_growth_row(label, a, b))
    rows += [_growth_row(key, low[key], high[key]) for key in ("python_ms_per_add", "add_mean_ms")]
    return sorted(rows, key=lambda r: -abs(r["delta_ms"]))


def _growth_row(step: str, a: float, b: float) -> dict[str, Any]:
    return {
        "step": step,
        "low_ms": a,
        "high_ms": b,
        "delta_ms": round(b - a, 3),
        "ratio": round(b / a, 2) if a else None,
    }
