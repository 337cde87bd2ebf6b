"""Fuzz a CNI plugin executable against the CNI contract (``pycni fuzz``).

Each example runs in a fresh throwaway "host" network namespace (the plugin is exec'd there)
with a fresh container namespace, a fresh temporary data dir (host-local's ``dataDir``, tuning's,
and pycni's ``$PYCNI_STATE_DIR``) and subnets from 198.18.0.0/15 and fd00:18::/48; all of it
is removed after the example, whatever happened. A chained plugin (portmap, firewall, ...) gets
its ``prevResult`` made real first: a veth pair between the two namespaces carrying the
result's addresses and routes, as an interface plugin would have left it.

The first examples are the type's canonical ones, what real users run: the simplest valid
config at each version the plugin lists (newest first), with IPv4-only, IPv6-only and
dual-stack addresses (its IPAM ranges, or a chained type's prevResult) and every capability it
declares asked for (portmap: one mapping). The rest are drawn: a valid config for the type
(with capability args, ``CNI_ARGS`` and, for chained types, a prevResult of the config's
version), a mutation of one, hostile stdin bytes, or a hostile ``CNI_*`` environment. The
contract checked, per example:

* every call exits 0 with output that parses as a result of the config's version (ADD), or
  non-zero with a well-formed error (``code``, ``msg``) on stdout; it is not killed by a
  signal, finishes within the timeout, writes at most :data:`MAX_OUTPUT` bytes and leaves no
  process holding its output;
* CHECK right after a successful ADD succeeds (config version >= 0.4.0);
* DEL after a successful ADD succeeds, and a second DEL succeeds too;
* after DEL nothing of the attachment remains: no link the plugin made (a bridge, shared by
  design, excepted), no address or route of its IPs, no nft/iptables rule naming its container
  ID or IPs, no file in its data dir named after its IPs or holding its container ID.

A violation of a drawn example is shrunk by hypothesis to a minimal example (a canonical one is
minimal already) and reported with the exact stdin, environment and command line of every call
(:class:`Step`).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from . import netns, strategies
from .errors import CNIError, PluginError, PluginTimeoutError, ResultError
from .sdk.invoke import raw_exec
from .types import AnyResult, Result020, parse_result
from .version import SUPPORTED, supports_check, supports_prev_result_on_del

__all__ = [
    "COMMANDS",
    "CHAINED_TYPES",
    "MAX_OUTPUT",
    "Options",
    "Step",
    "Violation",
    "Report",
    "fuzz",
    "probe_versions",
]

COMMANDS = ("ADD", "CHECK", "DEL")
#: Types that act on a prevResult instead of making an interface.
CHAINED_TYPES = frozenset({"portmap", "firewall", "tuning", "bandwidth", "sbr", "vrf", "consul-cni"})
#: Capabilities a type declares, and so gets runtimeConfig for.
CAPABILITIES = {"portmap": ("portMappings",), "bandwidth": ("bandwidth",)}
#: More output than this from one call is a violation (a plugin's result is a few KiB).
MAX_OUTPUT = 1024 * 1024
V4_POOL = ipaddress.IPv4Network("198.18.0.0/15")
V6_POOL = ipaddress.IPv6Network("fd00:18::/48")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # plugins find iptables on it
KINDS = ("canonical", "valid", "mutated", "hostile-bytes", "hostile-env")
# Mostly valid examples (the contract past ADD needs them); shrinking moves towards "valid".
_KIND_WEIGHTS = ("valid",) * 5 + ("mutated",) * 3 + ("hostile-env",) * 2 + ("hostile-bytes",)


@attrs.frozen
class Options:
    plugin: str
    plugin_type: str
    commands: tuple[str, ...] = COMMANDS
    examples: int = 100
    seed: int | None = None
    timeout: float = 10.0
    versions: tuple[str, ...] = SUPPORTED


@attrs.frozen
class Step:
    """One call of the plugin, exactly as made, and how it ended."""

    command: str
    argv: tuple[str, ...]
    env: dict[str, str]
    stdin: bytes
    returncode: int | None
    stdout: bytes
    stderr: bytes
    seconds: float
    failure: str = ""  # a timeout, the output bound or a stray process (raw_exec's refusal)

    def shell(self) -> str:
        """A command line that makes the same call (run it inside the host namespace)."""
        env = " ".join(shlex.quote(f"{k}={v}") for k, v in self.env.items())
        return f"printf {_printf_quote(self.stdin)} | env -i {env} {shlex.join(self.argv)}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "command": self.command,
            "argv": list(self.argv),
            "env": self.env,
            "returncode": self.returncode,
            "seconds": round(self.seconds, 4),
            "shell": self.shell(),
        }
        for name, data in (("stdin", self.stdin), ("stdout", self.stdout), ("stderr", self.stderr)):
            try:
                out[name] = data.decode("utf-8")
            except UnicodeDecodeError:
                out[name + "_hex"] = data.hex()
        if self.failure:
            out["failure"] = self.failure
        return out


class Violation(Exception):
    """A breach of the CNI contract; :attr:`check` names which, :attr:`steps` led to it."""

    check = "violation"

    def __init__(self, message: str, steps: Sequence[Step], setup: str, kind: str) -> None:
        super().__init__(message)
        self.message = message
        self.steps = tuple(steps)
        self.setup = setup
        self.kind = kind

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "message": self.message,
            "example_kind": self.kind,
            "setup": self.setup,
            "steps": [s.to_json() for s in self.steps],
        }

    def reproducer(self) -> str:
        lines = [f"{self.check}: {self.message}", f"  example: {self.kind}", f"  setup: {self.setup}"]
        for i, s in enumerate(self.steps, 1):
            shown = s.shell()
            if len(shown) > 6000:
                shown = shown[:6000] + f" ... ({len(s.stdin)} bytes of stdin; the whole call is in --json)"
            lines += [
                f"  call {i}: {s.command} -> {_ending(s)}",
                f"    $ {shown}",
            ]
            if s.stdout:
                lines.append(f"    stdout: {_excerpt(s.stdout)}")
            if s.stderr:
                lines.append(f"    stderr: {_excerpt(s.stderr)}")
        return "\n".join(lines)


#: One subclass per check, so hypothesis shrinks and reports each kind of violation separately.
CHECKS = {
    "signal": "killed by a signal",
    "hang": "no answer within the timeout",
    "output-bound": f"more than {MAX_OUTPUT} bytes of output",
    "stray-process": "exited, but a process it started kept its output open",
    "bad-result": "exit 0 without a result of the config's version",
    "bad-error": "non-zero exit without a well-formed error (code, msg) on stdout",
    "check-after-add": "CHECK right after a successful ADD failed",
    "del-after-add": "DEL after a successful ADD failed",
    "del-twice": "a second DEL failed",
    "leftovers": "something of the attachment remains after DEL",
}
_VIOLATIONS: dict[str, type[Violation]] = {
    name: type(f"Violation_{name.replace('-', '_')}", (Violation,), {"check": name, "__doc__": doc})
    for name, doc in CHECKS.items()
}


@attrs.define
class Report:
    options: Options
    examples: int = 0
    after_first_violation: int = 0  # runs while hypothesis shrinks (and looks for other violations)
    kinds: dict[str, int] = attrs.Factory(dict)
    outcomes: dict[str, dict[str, int]] = attrs.Factory(dict)
    samples: dict[str, str] = attrs.Factory(dict)  # "ADD error 7 (valid)" -> the first such message
    violations: list[Violation] = attrs.Factory(list)
    seconds: float = 0.0

    def record(self, kind: str, steps: Sequence[Step], shrinking: bool) -> None:
        if shrinking:
            self.after_first_violation += 1
            return
        self.examples += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        for s in steps:
            outcome = "ok" if s.returncode == 0 and not s.failure else _outcome(s)
            by = self.outcomes.setdefault(s.command, {})
            by[outcome] = by.get(outcome, 0) + 1
            if outcome != "ok":
                self.samples.setdefault(f"{s.command} {outcome} ({kind})", _excerpt(s.stdout or s.stderr, 200))

    def to_json(self) -> dict[str, Any]:
        o = self.options
        return {
            "plugin": o.plugin,
            "type": o.plugin_type,
            "commands": list(o.commands),
            "versions": list(o.versions),
            "seed": o.seed,
            "timeout": o.timeout,
            "examples": self.examples,
            "runs_after_first_violation": self.after_first_violation,
            "example_kinds": self.kinds,
            "outcomes": self.outcomes,
            "first_messages": self.samples,
            "seconds": round(self.seconds, 1),
            "violations": [v.to_json() for v in self.violations],
        }

    def summary(self) -> str:
        o = self.options
        lines = [
            f"pycni fuzz {o.plugin} (type {o.plugin_type}, versions {', '.join(o.versions)}, seed {o.seed}): "
            f"{self.examples} examples ({', '.join(f'{k} {n}' for k, n in sorted(self.kinds.items()))})"
            f" + {self.after_first_violation} runs after the first violation (shrinking), {self.seconds:.1f} s",
        ]
        for command in (*COMMANDS, "VERSION"):
            if command in self.outcomes:
                counts = ", ".join(f"{k} {n}" for k, n in sorted(self.outcomes[command].items()))
                lines.append(f"  {command}: {counts}")
        if not self.violations:
            lines.append("no contract violation found")
        else:
            lines.append(f"{len(self.violations)} contract violation(s):")
            lines += [f"  {v.check}: {v.message}" for v in self.violations]
        return "\n".join(lines)


# --- running the plugin ---------------------------------------------------------------------------


def _call(options: Options, host: str, command: str, env: dict[str, str], stdin: bytes) -> Step:
    env = {**env, "CNI_COMMAND": command}
    argv = (options.plugin,)
    start = time.monotonic()
    try:
        outcome = netns.run_in(
            host, raw_exec, options.plugin, stdin, env, timeout=options.timeout, max_output=MAX_OUTPUT
        )
    except PluginTimeoutError:
        return Step(command, argv, env, stdin, None, b"", b"", time.monotonic() - start, "hang")
    except PluginError as e:
        failure = "output-bound" if "bytes of output" in str(e) else "stray-process"
        return Step(command, argv, env, stdin, None, b"", b"", time.monotonic() - start, failure)
    return Step(command, argv, env, stdin, outcome.returncode, outcome.stdout, outcome.stderr, outcome.duration)


def probe_versions(plugin: str, timeout: float = 10.0) -> tuple[str, ...]:
    """The spec versions the plugin says it supports (``VERSION``) that pycni knows; all of them
    when the plugin does not answer usefully."""
    try:
        out = raw_exec(plugin, b'{"cniVersion":"1.0.0"}', {"CNI_COMMAND": "VERSION", "PATH": PATH}, timeout=timeout)
        said = json.loads(out.stdout).get("supportedVersions")
    except (CNIError, OSError, ValueError, AttributeError):
        return SUPPORTED
    known = tuple(v for v in SUPPORTED if isinstance(said, list) and v in said)
    return known or SUPPORTED


# --- the contract -------------------------------------------------------------------------------


def _well_formed_error(stdout: bytes) -> str | None:
    """Why ``stdout`` is no CNI error object (``None``: it is one)."""
    try:
        doc = json.loads(stdout)
    except (ValueError, RecursionError):
        return f"stdout is not JSON: {_excerpt(stdout)}"
    if not isinstance(doc, dict):
        return f"stdout is JSON but no object: {_excerpt(stdout)}"
    code, msg = doc.get("code"), doc.get("msg")
    if isinstance(code, bool) or not isinstance(code, int) or code < 0:
        return f"error has no unsigned integer code: {_excerpt(stdout)}"
    if not isinstance(msg, str) or not msg:
        return f"error has no msg: {_excerpt(stdout)}"
    return None


def _judge(step: Step, version: Any) -> tuple[str, str] | None:
    """(check, message) when ``step`` breaks the per-call contract."""
    if step.failure:
        return step.failure, f"{step.command}: {CHECKS[step.failure]} ({_limit_text(step)})"
    assert step.returncode is not None
    if step.returncode < 0:
        return "signal", f"{step.command}: killed by signal {-step.returncode}: {_excerpt(step.stderr)}"
    if step.returncode != 0:
        why = _well_formed_error(step.stdout)
        return None if why is None else ("bad-error", f"{step.command} exited {step.returncode}: {why}")
    if step.command != "ADD":
        return None
    known = version if isinstance(version, str) and version in SUPPORTED else None
    try:
        result = parse_result(step.stdout, config_version=known if known is not None else "")
    except ResultError as e:
        return "bad-result", f"ADD exited 0 but its output is no result: {e}: {_excerpt(step.stdout)}"
    if known is not None and result.cni_version != known:
        return "bad-result", f"ADD of a {known} config printed a {result.cni_version} result"
    return None


def _limit_text(step: Step) -> str:
    return (
        f"timeout {step.env.get('CNI_COMMAND')} after {step.seconds:.1f} s" if step.failure == "hang" else step.failure
    )


# --- examples -----------------------------------------------------------------------------------


@attrs.frozen
class _World:
    host: str
    container: str
    data_dir: str
    v4: ipaddress.IPv4Network
    v6: ipaddress.IPv6Network


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Stop signals wait until the block ends, so a world is made and removed whole (a signal
    between making a namespace and registering its removal would leak it)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def _world(index: int) -> Iterator[_World]:
    """A host and a container namespace and a data dir, removed afterwards whatever happens."""
    prefix = f"pycni-fuzz-{os.getpid()}"
    stack = contextlib.ExitStack()
    try:
        with _signals_held():
            host = stack.enter_context(netns.Throwaway(prefix))
            container = stack.enter_context(netns.Throwaway(prefix))
            netns.run_in(host.path, _host_link)
            data_dir = tempfile.mkdtemp(prefix=f"{prefix}-")
            stack.callback(shutil.rmtree, data_dir, True)
        v4 = list(V4_POOL.subnets(new_prefix=24))[index % 512]
        v6 = ipaddress.IPv6Network((int(V6_POOL.network_address) + (index % 65536) * 2**64, 64))
        yield _World(host.path, container.path, data_dir, v4, v6)
    finally:
        with _signals_held():
            stack.close()


@attrs.frozen
class _Example:
    kind: str
    version: Any  # the config's cniVersion (anything, once mutated)
    config: Any  # decoded JSON
    stdin: bytes
    env: dict[str, str]
    attachment: AnyResult | None  # the prevResult made real before ADD
    ifname: str  # the attachment's container interface (CNI_IFNAME unless the env is hostile)


def _pin_data_dirs(config: Any, world: _World) -> Any:
    """Whatever a mutation did, the plugin's data dirs stay inside the example's temp dir, so no
    plugin ever writes to its default (/var/lib/cni/networks, /run/cni)."""
    if not isinstance(config, dict):
        return config
    config = dict(config)
    ipam = config.get("ipam")
    if isinstance(ipam, dict):
        config["ipam"] = {**ipam, "dataDir": os.path.join(world.data_dir, "ipam")}
    if config.get("type") == "tuning" or "dataDir" in config:
        config["dataDir"] = os.path.join(world.data_dir, "tuning")
    return config


def _examples(
    options: Options,
    world: _World,
    *,
    kinds: Sequence[str] = _KIND_WEIGHTS,
    versions: Sequence[str] | None = None,
    families: Sequence[int] = (),
) -> st.SearchStrategy[_Example]:
    """Examples at one of ``versions`` (default: the plugin's), of one of ``kinds``; addresses of
    one family or both, or (``families``) of exactly those."""
    within = [world.v4 if f == 4 else world.v6 for f in families or (4, 6)]
    every = bool(families)
    t = options.plugin_type
    chained = t in CHAINED_TYPES

    @st.composite
    def build(draw: st.DrawFn) -> _Example:
        kind = draw(st.sampled_from(kinds))
        version = draw(st.sampled_from(versions or options.versions))
        ifname = draw(st.just("eth0") | strategies.ifnames.filter(lambda n: n != "lo"))
        # A distinctive prefix, so that finding the ID in a rule or file after DEL means it (a
        # shrunk ID "0" would be found in every counter).
        cid = "fuzz" + draw(strategies.container_ids)
        config = draw(
            strategies.network_configs(t, version=version, within=within, data_dir="pinned", every_family=every)
        )
        attachment = None
        if chained:
            attachment = draw(
                strategies.attachment_results(
                    version, ifname=ifname, sandbox=world.container, within=within, every_family=every
                )
            )
            config["prevResult"] = attachment.to_json()
        caps = CAPABILITIES.get(t, ())
        if caps:
            config["capabilities"] = {c: True for c in caps}
            config["runtimeConfig"] = draw(strategies.capability_args(caps, within=within))
        env = {
            "CNI_CONTAINERID": cid,
            "CNI_NETNS": world.container,
            "CNI_IFNAME": ifname,
            "CNI_PATH": os.path.dirname(os.path.abspath(options.plugin)),
        }
        if draw(st.booleans()):
            env["CNI_ARGS"] = draw(strategies.cni_args(ignore_unknown=True))
        if kind == "mutated":
            if not chained and draw(st.integers(0, 3)) == 0:  # an interface plugin handed a prevResult
                config["prevResult"] = draw(strategies.results().map(lambda r: r.to_json()))
            config = draw(strategies.mutations(config))
        elif kind == "hostile-env":
            # the same IDs, one variable broken (or gone)
            hostile = draw(
                strategies.cni_environments(
                    "ADD", netns=world.container, path=env["CNI_PATH"], container_id=cid, ifname=ifname, hostile=True
                )
            )
            env = {k: v for k, v in hostile.items() if k != "CNI_COMMAND"}
        config = _pin_data_dirs(config, world)
        stdin = json.dumps(config).encode()
        if kind == "hostile-bytes":
            stdin = draw(strategies.hostile_bytes(st.just(config)))
        declared = config.get("cniVersion") if isinstance(config, dict) else None
        return _Example(kind, declared, config, stdin, env, attachment, ifname)

    return build()


def _families(example: _Example) -> set[int]:
    """The IP families an example's attachment or IPAM ranges have."""
    if example.attachment is not None:
        return {address.version for address, _ in _addresses(example.attachment)}
    ipam = example.config.get("ipam") if isinstance(example.config, dict) else None
    if not isinstance(ipam, dict):
        return set()
    subnets = [r["subnet"] for rs in ipam.get("ranges", []) for r in rs if "subnet" in r]
    subnets += [a["address"] for a in ipam.get("addresses", []) if "address" in a]  # static's
    return {ipaddress.ip_interface(s).version for s in subnets}


#: The capability args of a canonical example: what a runtime passes for one container.
_CANONICAL_ARGS: dict[str, Any] = {
    "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
    "bandwidth": {"ingressRate": 10**6, "ingressBurst": 10**5, "egressRate": 10**6, "egressBurst": 10**5},
}


def _canonical(options: Options, world: _World, version: str, families: tuple[int, ...]) -> _Example | None:
    """The simplest valid example at ``version`` with addresses of exactly ``families`` (none:
    as the type has them, for a type that takes none), every capability the type declares
    asked for; None if the type has no such example."""
    from random import Random

    from hypothesis import find
    from hypothesis.errors import NoSuchExample

    strategy = _examples(options, world, kinds=("valid",), versions=(version,), families=families)
    try:
        example = find(
            strategy,
            lambda e: _families(e) == set(families),
            # Generation starts from the simplest example: nothing to shrink.
            settings=settings(
                database=None, max_examples=10, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
            ),
            random=Random(0),
        )
    except NoSuchExample:
        return None
    config = example.config
    caps = CAPABILITIES.get(options.plugin_type, ())
    if caps:
        config = {**config, "runtimeConfig": {c: _CANONICAL_ARGS[c] for c in caps}}
    return attrs.evolve(example, kind="canonical", config=config, stdin=json.dumps(config).encode())


def _with_prev_result(example: _Example, result: bytes) -> bytes:
    config = dict(example.config)
    try:
        config["prevResult"] = json.loads(result)
    except ValueError:
        pass
    return json.dumps(config).encode()


def _run_example(options: Options, world: _World, example: _Example) -> tuple[list[Step], tuple[str, str] | None]:
    """Make every call the example calls for; (the calls, the first violation or None)."""
    env = {
        "PATH": PATH,
        "PYCNI_STATE_DIR": os.path.join(world.data_dir, "state"),
        **example.env,
    }
    steps: list[Step] = []

    def call(command: str, stdin: bytes) -> Step:
        step = _call(options, world.host, command, env, stdin)
        steps.append(step)
        return step

    if example.attachment is not None:
        netns.run_in(world.host, _materialize, world.container, example.attachment, example.ifname)
    if "ADD" not in options.commands:
        for command in options.commands:
            found = _judge(call(command, example.stdin), example.version)
            if found:
                return steps, found
        return steps, None

    before = _settled(world)
    add = call("ADD", example.stdin)
    found = _judge(add, example.version)
    if found:
        return steps, found
    added = add.returncode == 0
    # The rest of the contract needs a config the runtime could have sent again (an object).
    if not isinstance(example.config, dict) or example.kind == "hostile-bytes":
        return steps, None
    version = example.version if isinstance(example.version, str) else ""
    follow_up = _with_prev_result(example, add.stdout) if added else example.stdin
    if added and "CHECK" in options.commands and _version_ok(version, supports_check):
        check = call("CHECK", follow_up)
        found = _judge(check, version)
        if found:
            return steps, found
        if check.returncode != 0 and example.kind != "hostile-env":
            return steps, ("check-after-add", f"CHECK after a successful ADD failed: {_excerpt(check.stdout)}")
    if "DEL" not in options.commands:
        return steps, None
    del_stdin = follow_up if _version_ok(version, supports_prev_result_on_del) else example.stdin
    for attempt in ("first", "second"):
        delete = call("DEL", del_stdin)
        found = _judge(delete, version)
        if found:
            return steps, found
        if delete.returncode != 0:
            if not added or example.kind == "hostile-env":
                return steps, None
            name = "del-after-add" if attempt == "first" else "del-twice"
            return steps, (name, f"{attempt} DEL after a successful ADD failed: {_excerpt(delete.stdout)}")
    if added:
        ips = _attachment_ips(add.stdout, example.attachment)
        left = _leftovers(before, _state(world), example.env.get("CNI_CONTAINERID", ""), ips, world.data_dir)
        if left:
            return steps, ("leftovers", "after DEL: " + "; ".join(left))
    return steps, None


def _version_ok(version: str, gate: Callable[[str], bool]) -> bool:
    try:
        return gate(version)
    except CNIError:
        return False


def fuzz(options: Options, progress: Callable[[Report, bool], None] | None = None) -> Report:
    """Run ``options.examples`` examples, the canonical ones (:func:`_run_canonical`) first;
    every distinct kind of violation found is kept in the report (with the calls of its
    minimal example: a random one is shrunk)."""
    report = Report(options)
    started = time.monotonic()
    counter = [0]
    _run_canonical(options, report, counter, progress)
    canonical = {v.check for v in report.violations}
    if report.examples < options.examples:
        _run_random(options, report, counter, progress, canonical)
    report.seconds = time.monotonic() - started
    report.violations.sort(key=lambda v: list(CHECKS).index(v.check))
    return report


def _run_canonical(
    options: Options, report: Report, counter: list[int], progress: Callable[[Report, bool], None] | None
) -> None:
    """The canonical examples, within the examples asked for: at every version the plugin
    lists, newest first, IPv4-only, IPv6-only and dual-stack (one for a type that takes no
    addresses). A violation is kept as found: it is as simple as its kind gets."""
    for version in reversed(options.versions):  # newest first: what most users run
        for families in ((4,), (6,), (4, 6)):
            if report.examples >= options.examples:
                return
            counter[0] += 1
            with _world(counter[0]) as world:
                example = _canonical(options, world, version, families)
                if example is None:  # the type takes no addresses: its one canonical example
                    example = _canonical(options, world, version, ())
                if example is None:
                    break
                steps, found = _run_example(options, world, example)
                setup = _setup_text(world, example)
            report.record(example.kind, steps, False)
            if progress is not None:
                progress(report, False)
            if found is not None and found[0] not in {v.check for v in report.violations}:
                check, message = found
                report.violations.append(_VIOLATIONS[check](message, steps, setup, example.kind))
            if not _families(example):
                break


def _run_random(
    options: Options,
    report: Report,
    counter: list[int],
    progress: Callable[[Report, bool], None] | None,
    known: set[str],
) -> None:
    """The rest of the examples, drawn by hypothesis; each kind of violation not in ``known`` is
    shrunk and kept."""
    shrinking = [False]

    @settings(
        max_examples=options.examples - report.examples,
        database=None,
        deadline=None,
        report_multiple_bugs=True,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate, Phase.shrink],
        print_blob=False,
    )
    @given(st.data())
    def one(data: st.DataObject) -> None:
        counter[0] += 1
        with _world(counter[0]) as world:
            example = data.draw(_examples(options, world), label="example")
            steps, found = _run_example(options, world, example)
        report.record(example.kind, steps, shrinking[0])
        if progress is not None:
            progress(report, shrinking[0])
        if found is not None and found[0] not in known:
            shrinking[0] = True  # hypothesis shrinks from its first failure on
            check, message = found
            raise _VIOLATIONS[check](message, steps, _setup_text(world, example), example.kind)

    if options.seed is not None:
        one = hypothesis_seed(options.seed)(one)
    drawn: list[Violation] = []
    try:
        one()
    except Violation as v:
        drawn.append(v)
    except BaseExceptionGroup as group:
        violations, rest = group.split(Violation)
        if rest is not None:
            raise rest from None
        drawn.extend(_flatten(violations))
    report.violations.extend(v for v in drawn if v.check not in known)


def _flatten(group: BaseExceptionGroup[Violation] | None) -> list[Violation]:
    if group is None:
        return []
    out: list[Violation] = []
    for e in group.exceptions:
        out.extend(_flatten(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


def _setup_text(world: _World, example: _Example) -> str:
    text = f"plugin exec'd in a fresh host netns ({world.host}); container netns {world.container}"
    if example.attachment is not None:
        text += (
            f"; before ADD, the prevResult made real: a veth from the host to {example.ifname!r} in the"
            " container with the result's addresses (host side: the gateways) and default routes"
        )
    return text + f"; data dir {world.data_dir} (all removed since)"


# --- the kernel: making a prevResult real, and what is there -----------------------------------------


def _addresses(result: AnyResult) -> list[tuple[Any, Any]]:
    if isinstance(result, Result020):
        return [(c.ip, c.gateway) for c in (result.ip4, result.ip6) if c is not None]
    return [(ip.address, ip.gateway) for ip in result.ips]


def _host_link() -> None:
    """(In the host namespace.) The link the configs of macvlan, ipvlan and vlan name as master
    and host-device's as its device (:data:`pycni.strategies.HOST_LINK`): a veth end with its
    peer up too, so it has carrier (without, IPv6 DAD never starts on what is made of it, and
    an ADD with an IPv6 gateway waits out its DAD timeout)."""
    from pyroute2 import IPRoute

    peer = f"{strategies.HOST_LINK}p"
    with IPRoute() as ipr:
        ipr.link("add", ifname=strategies.HOST_LINK, kind="veth", peer=peer, state="up")
        ipr.link("set", index=ipr.link_lookup(ifname=peer)[0], state="up")


def _materialize(container: str, result: AnyResult, ifname: str) -> None:
    """(In the host namespace.) A veth to ``ifname`` in ``container`` holding ``result``'s addresses."""
    from pyroute2 import IPRoute

    host_name = "pfz-host"
    interfaces = getattr(result, "interfaces", ())
    if interfaces and interfaces[0].name and interfaces[0].name != ifname:
        host_name = interfaces[0].name
    fd = os.open(container, os.O_RDONLY)
    try:
        with IPRoute() as ipr:
            ipr.link("add", ifname=host_name, kind="veth", peer={"ifname": ifname, "net_ns_fd": fd}, state="up")
            index = ipr.link_lookup(ifname=host_name)[0]
            for address, gateway in _addresses(result):
                if gateway is not None:
                    ipr.addr("add", index=index, address=str(gateway), prefixlen=address.network.prefixlen, flags=0x02)
    finally:
        os.close(fd)
    netns.run_in(container, _container_side, ifname, result)


def _container_side(ifname: str, result: AnyResult) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        ipr.link("set", index=index, state="up")
        for address, gateway in _addresses(result):
            ipr.addr("add", index=index, address=str(address.ip), prefixlen=address.network.prefixlen, flags=0x02)
            if gateway is not None:
                with contextlib.suppress(Exception):
                    ipr.route(
                        "add",
                        dst="default",
                        gateway=str(gateway),
                        oif=index,
                        family=socket.AF_INET if address.version == 4 else socket.AF_INET6,
                    )


def _settled(world: _World, timeout: float = 2.0) -> dict[str, dict[str, list[str]]]:
    """The state once the container's links, addresses and routes stop changing: the kernel adds a
    made-real prevResult's IPv6 local routes when the veth's carrier comes up, a moment later."""
    links, deadline = netns.run_in(world.container, _read_links), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.02)
        again = netns.run_in(world.container, _read_links)
        if again == links:
            break
        links = again
    return _state(world)


def _state(world: _World) -> dict[str, dict[str, list[str]]]:
    return {
        "host": netns.run_in(world.host, _read_state),
        "container": netns.run_in(world.container, _read_state),
    }


def _read_state() -> dict[str, list[str]]:
    """(In a namespace.) Its links, addresses, routes and packet-filter rules, as text lines."""
    return {**_read_links(), "rules": _rules()}


def _read_links() -> dict[str, list[str]]:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        names = {}
        links = []
        for link in ipr.link("dump"):
            names[link["index"]] = link.get("ifname")
            links.append(f"{link.get('ifname')} {link.get(('linkinfo', 'kind')) or 'device'}")
        addresses = [f"{names.get(a['index'])} {a.get('address')}/{a['prefixlen']}" for a in ipr.addr("dump")]
        routes = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for r in ipr.route("dump", family=family):
                routes.append(
                    f"{r.get('dst') or 'default'}/{r['dst_len']} via {r.get('gateway')} dev {names.get(r.get('oif'))}"
                    f" table {r.get('table')}"
                )
    return {"links": links, "addresses": addresses, "routes": routes}


def _rules() -> list[str]:
    """The nftables ruleset (pycni's tables, and iptables-nft's: its comments, addresses and
    targets all show there), plus iptables-save's where iptables is the legacy one."""
    lines: list[str] = []
    try:
        import nftables

        rc, out, _ = nftables.Nftables().cmd("list ruleset")
        if rc == 0:
            lines += out.splitlines()
    except ImportError:
        pass
    if _legacy_iptables():
        for tool in ("iptables-save", "ip6tables-save"):
            proc = subprocess.run([tool], capture_output=True, text=True, check=False)
            lines += [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    return [line.strip() for line in lines if line.strip()]


@functools.cache
def _legacy_iptables() -> bool:
    if not shutil.which("iptables-save"):
        return False
    version = subprocess.run(["iptables", "-V"], capture_output=True, text=True, check=False).stdout
    return "nf_tables" not in version


def _attachment_ips(add_stdout: bytes, attachment: AnyResult | None) -> set[str]:
    ips: set[str] = set()
    for source in (add_stdout, attachment):
        if source is None:
            continue
        try:
            result = parse_result(source if isinstance(source, bytes) else source.to_json())
        except ResultError:
            continue
        ips |= {str(a.ip) for a, _ in _addresses(result)}
    return ips


def _ip_pattern(ip: str) -> str:
    """``ip`` as a whole address: ``10.0.0.2`` matches in ``10.0.0.2:80`` but not in ``10.0.0.20``."""
    addr = ipaddress.ip_address(ip)
    edge = "[0-9.]" if addr.version == 4 else "[0-9a-fA-F:]"
    return rf"(?<!{edge}){re.escape(addr.compressed)}(?!{edge})"


def _leftovers(
    before: dict[str, dict[str, list[str]]],
    after: dict[str, dict[str, list[str]]],
    container_id: str,
    ips: set[str],
    data_dir: str,
) -> list[str]:
    patterns = [_ip_pattern(ip) for ip in ips]
    if len(container_id) >= 4:  # a shorter (hostile) one would be found in every counter
        patterns.append(rf"(?<![\w.-]){re.escape(container_id)}(?![\w.-])")
    mentions = re.compile("|".join(patterns)) if patterns else None
    out: list[str] = []
    for where in ("host", "container"):
        new = {key: [x for x in after[where][key] if x not in set(before[where][key])] for key in after[where]}
        # A host bridge is shared by every container on it: the reference bridge never deletes it.
        links = [x for x in new["links"] if where == "container" or not x.endswith(" bridge")]
        if links:
            out.append(f"{where} links {links}")
        bridges = {x.split()[0] for x in after[where]["links"] if x.endswith(" bridge")}
        addresses = [
            a
            for a in new["addresses"]
            if (mentions and mentions.search(a)) or (a.split()[0] not in bridges and " fe80:" not in a)
        ]
        if addresses:
            out.append(f"{where} addresses {addresses}")
        # The kernel's own local-table route for an address that was there before ADD (it can
        # appear late, when the made-real prevResult's veth gets its carrier) is not the plugin's.
        had = {a.split()[1].split("/")[0] for a in before[where]["addresses"]}
        routes = [
            r
            for r in new["routes"]
            if mentions
            and mentions.search(r.split(" dev ")[0])
            and not (r.endswith(" table 255") and r.split("/")[0] in had)
        ]
        if routes:
            out.append(f"{where} routes {routes}")
        rules = [r for r in new["rules"] if mentions and mentions.search(r)]
        if rules:
            out.append(f"{where} rules {rules[:6]}{' ...' if len(rules) > 6 else ''}")
    files = []
    for root, _, names in os.walk(data_dir):
        for name in names:
            path = os.path.join(root, name)
            try:
                with open(path, "rb") as f:
                    content = f.read(65536).decode("utf-8", "replace")
            except OSError:
                continue
            if name in ips or (
                len(container_id) >= 4 and re.search(rf"(?<![\w.-]){re.escape(container_id)}(?![\w.-])", content)
            ):
                files.append(os.path.relpath(path, data_dir))
    if files:
        out.append(f"files in the data dir {sorted(files)}")
    return out


# --- text ---------------------------------------------------------------------------------------


def _excerpt(data: bytes, limit: int = 300) -> str:
    text = data.decode("utf-8", "backslashreplace").strip()
    return text if len(text) <= limit else text[:limit] + f"... ({len(data)} bytes)"


def _outcome(step: Step) -> str:
    if step.failure:
        return step.failure
    if step.returncode is not None and step.returncode < 0:
        return f"signal {-step.returncode}"
    try:
        return f"error {json.loads(step.stdout)['code']}"
    except (ValueError, KeyError, TypeError, RecursionError):
        return f"exit {step.returncode}"


def _ending(step: Step) -> str:
    return step.failure or ("ok" if step.returncode == 0 else _outcome(step))


def _printf_quote(data: bytes) -> str:
    """A ``printf`` format that prints ``data`` exactly (octal escapes for anything unsafe)."""
    out = []
    for b in data:
        c = chr(b)
        if c == "%":
            out.append("%%")
        elif c == "\\":
            out.append("\\\\")
        elif 32 <= b < 127 and c != "'":
            out.append(c)
        else:
            out.append(f"\\{b:03o}")
    return "'" + "".join(out) + "'"
