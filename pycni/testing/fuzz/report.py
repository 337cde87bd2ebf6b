"""What a run asked for, every call it made and what it found: :class:`Options`, :class:`Step`,
:class:`Violation` (a subclass per check, :data:`VIOLATIONS`) and :class:`Report` (the summary
and ``--json``), with the reproducer text of each call."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

import attrs

from ...version import SUPPORTED

__all__ = ["COMMANDS", "MAX_OUTPUT", "CHECKS", "VIOLATIONS", "Options", "Step", "Violation", "Report", "excerpt"]

COMMANDS = ("ADD", "CHECK", "DEL")
#: More output than this from one call is a violation (a plugin's result is a few KiB).
MAX_OUTPUT = 1024 * 1024


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
                lines.append(f"    stdout: {excerpt(s.stdout)}")
            if s.stderr:
                lines.append(f"    stderr: {excerpt(s.stderr)}")
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
VIOLATIONS: dict[str, type[Violation]] = {
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
                self.samples.setdefault(f"{s.command} {outcome} ({kind})", excerpt(s.stdout or s.stderr, 200))

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


def excerpt(data: bytes, limit: int = 300) -> str:
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
