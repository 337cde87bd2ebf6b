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

The parts: :mod:`.world` makes and removes each example's namespaces and reads the kernel back
(the only part that touches it), :mod:`.examples` draws the examples, :mod:`.contract` calls the
plugin and judges its answers, :mod:`.report` records the calls and writes the findings; here,
the run: canonical examples, then drawn ones, shrunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from .contract import probe_versions, run_example
from .examples import CHAINED_TYPES, Example, address_families, canonical_example, example_strategy
from .report import CHECKS, COMMANDS, MAX_OUTPUT, VIOLATIONS, Options, Report, Step, Violation
from .world import World, throwaway_world

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
            with throwaway_world(counter[0]) as world:
                example = canonical_example(options, world, version, families)
                if example is None:  # the type takes no addresses: its one canonical example
                    example = canonical_example(options, world, version, ())
                if example is None:
                    break
                steps, found = run_example(options, world, example)
                setup = _setup_text(world, example)
            report.record(example.kind, steps, False)
            if progress is not None:
                progress(report, False)
            if found is not None and found[0] not in {v.check for v in report.violations}:
                check, message = found
                report.violations.append(VIOLATIONS[check](message, steps, setup, example.kind))
            if not address_families(example):
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
        with throwaway_world(counter[0]) as world:
            example = data.draw(example_strategy(options, world), label="example")
            steps, found = run_example(options, world, example)
        report.record(example.kind, steps, shrinking[0])
        if progress is not None:
            progress(report, shrinking[0])
        if found is not None and found[0] not in known:
            shrinking[0] = True  # hypothesis shrinks from its first failure on
            check, message = found
            raise VIOLATIONS[check](message, steps, _setup_text(world, example), example.kind)

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


def _setup_text(world: World, example: Example) -> str:
    text = f"plugin exec'd in a fresh host netns ({world.host}); container netns {world.container}"
    if example.attachment is not None:
        text += (
            f"; before ADD, the prevResult made real: a veth from the host to {example.ifname!r} in the"
            " container with the result's addresses (host side: the gateways) and default routes"
        )
    return text + f"; data dir {world.data_dir} (all removed since)"
