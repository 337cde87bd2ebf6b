"""The contract, judged: every call of the plugin made and recorded exactly (:func:`call_plugin`),
each answer judged (:func:`judge`), and an example's calls in order (ADD, CHECK, DEL twice) with
what must be gone after the DEL (:func:`run_example`)."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import time
from collections.abc import Callable
from typing import Any

from ... import netns
from ...errors import CNIError, PluginError, PluginTimeoutError, ResultError
from ...sdk.invoke import raw_exec
from ...types import AnyResult, parse_result
from ...version import SUPPORTED, supports_check, supports_prev_result_on_del
from .examples import Example
from .report import CHECKS, MAX_OUTPUT, Options, Step, excerpt
from .world import World, addresses, materialize, settled, state

__all__ = ["PATH", "call_plugin", "probe_versions", "judge", "run_example"]

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # plugins find iptables on it


def call_plugin(options: Options, host: str, command: str, env: dict[str, str], stdin: bytes) -> Step:
    """One call, exec'd in the ``host`` namespace and recorded as made; a timeout, the output
    bound or a stray process ends the step (:attr:`Step.failure`), it raises nothing."""
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


def _well_formed_error(stdout: bytes) -> str | None:
    """Why ``stdout`` is no CNI error object (``None``: it is one)."""
    try:
        doc = json.loads(stdout)
    except (ValueError, RecursionError):
        return f"stdout is not JSON: {excerpt(stdout)}"
    if not isinstance(doc, dict):
        return f"stdout is JSON but no object: {excerpt(stdout)}"
    code, msg = doc.get("code"), doc.get("msg")
    if isinstance(code, bool) or not isinstance(code, int) or code < 0:
        return f"error has no unsigned integer code: {excerpt(stdout)}"
    if not isinstance(msg, str) or not msg:
        return f"error has no msg: {excerpt(stdout)}"
    return None


def judge(step: Step, version: Any) -> tuple[str, str] | None:
    """(check, message) when ``step`` breaks the per-call contract."""
    if step.failure:
        return step.failure, f"{step.command}: {CHECKS[step.failure]} ({_limit_text(step)})"
    assert step.returncode is not None
    if step.returncode < 0:
        return "signal", f"{step.command}: killed by signal {-step.returncode}: {excerpt(step.stderr)}"
    if step.returncode != 0:
        why = _well_formed_error(step.stdout)
        return None if why is None else ("bad-error", f"{step.command} exited {step.returncode}: {why}")
    if step.command != "ADD":
        return None
    known = version if isinstance(version, str) and version in SUPPORTED else None
    try:
        result = parse_result(step.stdout, config_version=known if known is not None else "")
    except ResultError as e:
        return "bad-result", f"ADD exited 0 but its output is no result: {e}: {excerpt(step.stdout)}"
    if known is not None and result.cni_version != known:
        return "bad-result", f"ADD of a {known} config printed a {result.cni_version} result"
    return None


def _limit_text(step: Step) -> str:
    return (
        f"timeout {step.env.get('CNI_COMMAND')} after {step.seconds:.1f} s" if step.failure == "hang" else step.failure
    )


def _with_prev_result(example: Example, result: bytes) -> bytes:
    config = dict(example.config)
    try:
        config["prevResult"] = json.loads(result)
    except ValueError:
        pass
    return json.dumps(config).encode()


def run_example(options: Options, world: World, example: Example) -> tuple[list[Step], tuple[str, str] | None]:
    """Make every call the example calls for; (the calls, the first violation or None)."""
    env = {
        "PATH": PATH,
        "PYCNI_STATE_DIR": os.path.join(world.data_dir, "state"),
        **example.env,
    }
    steps: list[Step] = []

    def call(command: str, stdin: bytes) -> Step:
        step = call_plugin(options, world.host, command, env, stdin)
        steps.append(step)
        return step

    if example.attachment is not None:
        netns.run_in(world.host, materialize, world.container, example.attachment, example.ifname)
    if "ADD" not in options.commands:
        for command in options.commands:
            found = judge(call(command, example.stdin), example.version)
            if found:
                return steps, found
        return steps, None

    before = settled(world)
    add = call("ADD", example.stdin)
    found = judge(add, example.version)
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
        found = judge(check, version)
        if found:
            return steps, found
        if check.returncode != 0 and example.kind != "hostile-env":
            return steps, ("check-after-add", f"CHECK after a successful ADD failed: {excerpt(check.stdout)}")
    if "DEL" not in options.commands:
        return steps, None
    del_stdin = follow_up if _version_ok(version, supports_prev_result_on_del) else example.stdin
    for attempt in ("first", "second"):
        delete = call("DEL", del_stdin)
        found = judge(delete, version)
        if found:
            return steps, found
        if delete.returncode != 0:
            if not added or example.kind == "hostile-env":
                return steps, None
            name = "del-after-add" if attempt == "first" else "del-twice"
            return steps, (name, f"{attempt} DEL after a successful ADD failed: {excerpt(delete.stdout)}")
    if added:
        ips = _attachment_ips(add.stdout, example.attachment)
        left = _leftovers(before, state(world), example.env.get("CNI_CONTAINERID", ""), ips, world.data_dir)
        if left:
            return steps, ("leftovers", "after DEL: " + "; ".join(left))
    return steps, None


def _version_ok(version: str, gate: Callable[[str], bool]) -> bool:
    try:
        return gate(version)
    except CNIError:
        return False


def _attachment_ips(add_stdout: bytes, attachment: AnyResult | None) -> set[str]:
    ips: set[str] = set()
    for source in (add_stdout, attachment):
        if source is None:
            continue
        try:
            result = parse_result(source if isinstance(source, bytes) else source.to_json())
        except ResultError:
            continue
        ips |= {str(a.ip) for a, _ in addresses(result)}
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
