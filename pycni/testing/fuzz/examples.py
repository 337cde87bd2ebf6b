"""The examples: the canonical ones (what real users run) and drawn ones (valid, mutated, hostile
stdin bytes, a hostile environment), each in its own world."""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Sequence
from random import Random
from typing import Any

import attrs
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from ...types import AnyResult
from .. import strategies
from .report import Options
from .world import World, addresses

__all__ = [
    "CHAINED_TYPES",
    "CAPABILITIES",
    "Example",
    "example_strategy",
    "address_families",
    "canonical_example",
]

#: Types that act on a prevResult instead of making an interface.
CHAINED_TYPES = frozenset({"portmap", "firewall", "tuning", "bandwidth", "sbr", "vrf", "consul-cni"})
#: Capabilities a type declares, and so gets runtimeConfig for.
CAPABILITIES = {"portmap": ("portMappings",), "bandwidth": ("bandwidth",)}
# Mostly valid examples (the contract past ADD needs them); shrinking moves towards "valid".
_KIND_WEIGHTS = ("valid",) * 5 + ("mutated",) * 3 + ("hostile-env",) * 2 + ("hostile-bytes",)


@attrs.frozen
class Example:
    kind: str
    version: Any  # the config's cniVersion (anything, once mutated)
    config: Any  # decoded JSON
    stdin: bytes
    env: dict[str, str]
    attachment: AnyResult | None  # the prevResult made real before ADD
    ifname: str  # the attachment's container interface (CNI_IFNAME unless the env is hostile)


def _pin_data_dirs(config: Any, world: World) -> Any:
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


def example_strategy(
    options: Options,
    world: World,
    *,
    kinds: Sequence[str] = _KIND_WEIGHTS,
    versions: Sequence[str] | None = None,
    families: Sequence[int] = (),
) -> st.SearchStrategy[Example]:
    """Examples at one of ``versions`` (default: the plugin's), of one of ``kinds``; addresses of
    one family or both, or (``families``) of exactly those."""
    within = [world.v4 if f == 4 else world.v6 for f in families or (4, 6)]
    every = bool(families)
    t = options.plugin_type
    chained = t in CHAINED_TYPES

    @st.composite
    def build(draw: st.DrawFn) -> Example:
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
        return Example(kind, declared, config, stdin, env, attachment, ifname)

    return build()


def address_families(example: Example) -> set[int]:
    """The IP families an example's attachment or IPAM ranges have."""
    if example.attachment is not None:
        return {address.version for address, _ in addresses(example.attachment)}
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


def canonical_example(options: Options, world: World, version: str, families: tuple[int, ...]) -> Example | None:
    """The simplest valid example at ``version`` with addresses of exactly ``families`` (none:
    as the type has them, for a type that takes none), every capability the type declares
    asked for; None if the type has no such example."""
    strategy = example_strategy(options, world, kinds=("valid",), versions=(version,), families=families)
    try:
        example = find(
            strategy,
            lambda e: address_families(e) == set(families),
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
