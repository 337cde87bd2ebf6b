"""Network configs and conflists, prevResults, ``CNI_*`` environments and capability args."""

from __future__ import annotations

import ipaddress
import string
from collections.abc import Sequence
from ipaddress import IPv4Network, IPv6Network
from typing import Any

from hypothesis import strategies as st

from ...types import DNS, Interface, IPConfig, IPConfig020, IPConfig040, Result, Result020, Result040, Route
from ._results import VERSIONS, json_values

# --- network configs and conflists ----------------------------------------------------------------

#: Plugin types :func:`network_configs` knows the options of (any other type gets generic ones).
PLUGIN_TYPES: tuple[str, ...] = (
    "loopback",
    "bridge",
    "host-local",
    "ptp",
    "portmap",
    "firewall",
    "tuning",
    "bandwidth",
    "static",
    "macvlan",
    "ipvlan",
    "vlan",
    "host-device",
    "sbr",
    "vrf",
)
#: The host link the configs of macvlan, ipvlan and vlan name as master and host-device's as
#: its device, unless ``host_link`` says otherwise (``pycni fuzz`` makes it in each host).
HOST_LINK = "fuzzl0"
TEST_SUBNETS: tuple[IPv4Network | IPv6Network, ...] = (IPv4Network("198.18.0.0/15"), IPv6Network("fd00:18::/48"))

names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,20}", fullmatch=True)
link_names = st.from_regex(r"[a-z][a-z0-9]{0,9}", fullmatch=True)


def subnets(
    within: Sequence[IPv4Network | IPv6Network] = TEST_SUBNETS, *, family: int | None = None
) -> st.SearchStrategy[IPv4Network | IPv6Network]:
    """/24 (IPv4) and /64 (IPv6) subnets inside ``within``."""
    pools = [p for p in within if family in (None, p.version)]
    if not pools:
        raise ValueError(f"no IPv{family} pool in {list(map(str, within))}")

    def pick(pool: IPv4Network | IPv6Network) -> st.SearchStrategy[IPv4Network | IPv6Network]:
        plen = max(pool.prefixlen, 24 if pool.version == 4 else 64)
        count = 2 ** (plen - pool.prefixlen)
        step = 2 ** (pool.max_prefixlen - plen)
        return st.integers(0, count - 1).map(
            lambda i: ipaddress.ip_network((int(pool.network_address) + i * step, plen))
        )

    return st.sampled_from(pools).flatmap(pick)


def _ranges(nets: Sequence[IPv4Network | IPv6Network]) -> st.SearchStrategy[list[list[dict[str, Any]]]]:
    def one(net: IPv4Network | IPv6Network) -> st.SearchStrategy[dict[str, Any]]:
        hosts = 2 ** (net.max_prefixlen - net.prefixlen)
        first = st.integers(2, min(hosts - 2, 100))
        return st.builds(
            lambda lo, n, gw: {
                "subnet": str(net),
                **({"rangeStart": str(net[lo]), "rangeEnd": str(net[lo + n])} if n else {}),
                **({"gateway": str(net[1])} if gw else {}),
            },
            first,
            st.integers(0, 20),
            st.booleans(),
        )

    return st.tuples(*(one(n) for n in nets)).map(lambda items: [[item] for item in items])


def _family_nets(within: Sequence[IPv4Network | IPv6Network], every: bool = False) -> st.SearchStrategy[list[Any]]:
    """One subnet per family: IPv4, IPv6 or both (IPv4 more often, as on most hosts); ``every``:
    one of each family ``within`` has."""
    v4 = any(p.version == 4 for p in within)
    v6 = any(p.version == 6 for p in within)
    if every:
        return st.tuples(*(subnets(within, family=f) for f, ok in ((4, v4), (6, v6)) if ok)).map(list)
    choices = [f for f, ok in ((4, v4), (4, v4), (6, v6), (46, v4 and v6)) if ok]
    return st.sampled_from(choices).flatmap(
        lambda f: st.tuples(*(subnets(within, family=int(c)) for c in str(f))).map(list)
    )


def _host_local(
    within: Sequence[IPv4Network | IPv6Network], data_dir: str | None, every: bool = False
) -> st.SearchStrategy[dict[str, Any]]:
    return _family_nets(within, every).flatmap(
        lambda nets: st.fixed_dictionaries(
            {"type": st.just("host-local"), "ranges": _ranges(nets)},
            optional={
                "routes": st.just([{"dst": "0.0.0.0/0" if n.version == 4 else "::/0"} for n in nets]),
            },
        ).map(lambda ipam: {**ipam, **({"dataDir": data_dir} if data_dir else {})})
    )


def _static(within: Sequence[IPv4Network | IPv6Network], every: bool = False) -> st.SearchStrategy[dict[str, Any]]:
    """static IPAM: a host address (with its subnet's first as gateway, or none) per family."""

    def entry(net: IPv4Network | IPv6Network) -> st.SearchStrategy[dict[str, Any]]:
        return st.builds(
            lambda host, gw: {
                "address": f"{net[host]}/{net.prefixlen}",
                **({"gateway": str(net[1])} if gw else {}),
            },
            st.integers(2, 200),
            st.booleans(),
        )

    return _family_nets(within, every).flatmap(
        lambda nets: st.fixed_dictionaries(
            {"type": st.just("static"), "addresses": st.tuples(*(entry(n) for n in nets)).map(list)},
            optional={"routes": st.just([{"dst": "0.0.0.0/0" if n.version == 4 else "::/0"} for n in nets])},
        )
    )


def _options(
    plugin_type: str, within: Sequence[Any], data_dir: str | None, host_link: str = HOST_LINK, every: bool = False
) -> st.SearchStrategy[dict[str, Any]]:
    """The type's own members, valid for it."""
    ipam = _host_local(within, data_dir, every)
    mtu = st.sampled_from([1280, 1400, 1500, 9000])
    small_mtu = st.sampled_from([1280, 1400, 1500])  # at most the master's
    if plugin_type == "static":
        return _static(within, every).map(lambda i: {"ipam": i})
    if plugin_type == "macvlan":
        return st.fixed_dictionaries(
            {"master": st.just(host_link), "ipam": ipam},
            optional={"mode": st.sampled_from(["bridge", "private", "vepa"]), "mtu": small_mtu},
        )
    if plugin_type == "ipvlan":
        return st.fixed_dictionaries(
            {"master": st.just(host_link), "ipam": ipam},
            optional={"mode": st.sampled_from(["l2", "l3", "l3s"]), "mtu": small_mtu},
        )
    if plugin_type == "vlan":
        return st.fixed_dictionaries(
            {"master": st.just(host_link), "vlanId": st.integers(1, 4094), "ipam": ipam}, optional={"mtu": small_mtu}
        )
    if plugin_type == "host-device":
        return st.fixed_dictionaries({"device": st.just(host_link)}, optional={"ipam": ipam})
    table = st.integers(100, 10000).filter(lambda t: t not in (253, 254, 255))  # the kernel's own
    if plugin_type == "sbr":
        return st.fixed_dictionaries({}, optional={"table": table})
    if plugin_type == "vrf":
        return st.fixed_dictionaries({"vrfname": link_names.map(lambda n: f"vrf{n}")}, optional={"table": table})
    if plugin_type == "bridge":
        return st.fixed_dictionaries(
            {"bridge": link_names.map(lambda n: f"cni{n}"), "ipam": ipam},
            optional={
                "isGateway": st.booleans(),
                "isDefaultGateway": st.booleans(),
                "ipMasq": st.booleans(),
                "hairpinMode": st.booleans(),
                "forceAddress": st.booleans(),
                "mtu": mtu,
                "promiscMode": st.just(False),
            },
        )
    if plugin_type == "ptp":
        return st.fixed_dictionaries({"ipam": ipam}, optional={"ipMasq": st.booleans(), "mtu": mtu})
    if plugin_type == "host-local":  # exec'd as an IPAM plugin: the config's ipam is its own
        return ipam.map(lambda i: {"ipam": i})
    if plugin_type == "portmap":
        return st.fixed_dictionaries(
            {"capabilities": st.just({"portMappings": True})},
            optional={"snat": st.booleans(), "markMasqBit": st.integers(0, 31)},
        )
    if plugin_type == "firewall":
        return st.fixed_dictionaries({}, optional={"backend": st.sampled_from(["iptables"])})
    if plugin_type == "tuning":
        return st.fixed_dictionaries(
            {},
            optional={
                "mtu": mtu,
                "promisc": st.booleans(),
                "sysctl": st.just({"net.ipv4.conf.IFNAME.arp_notify": "1"}),
            },
        )
    if plugin_type == "bandwidth":
        return st.tuples(st.just({"capabilities": {"bandwidth": True}}), _rates(10**9, 10**7)).map(
            lambda t: {**t[0], **t[1]}
        )
    return st.just({}) if plugin_type == "loopback" else st.dictionaries(names, json_values, max_size=2)


def network_configs(
    plugin_type: str | None = None,
    *,
    version: str | None = None,
    name: str | None = None,
    within: Sequence[IPv4Network | IPv6Network] = TEST_SUBNETS,
    data_dir: str | None = None,
    prev_result: bool = False,
    host_link: str = HOST_LINK,
    every_family: bool = False,
) -> st.SearchStrategy[dict[str, Any]]:
    """Network configs (decoded JSON, a single ``.conf``) for ``plugin_type`` (any of
    :data:`PLUGIN_TYPES` when ``None``), valid for that type, at ``version`` (any of
    :data:`VERSIONS` that the type's result can be expressed in when ``None``). ``prev_result``
    adds a plausible ``prevResult`` (see :func:`attachment_results`) of the same version;
    ``host_link`` is the master of macvlan, ipvlan and vlan and host-device's device. Addresses
    (IPAM ranges) are of one family of ``within`` or both; ``every_family``: of each it has."""
    types = st.sampled_from(PLUGIN_TYPES) if plugin_type is None else st.just(plugin_type)
    versions = st.sampled_from(VERSIONS) if version is None else st.just(version)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        t, v = draw(types), draw(versions)
        conf: dict[str, Any] = {"cniVersion": v, "name": name or draw(names), "type": t}
        conf |= draw(_options(t, within, data_dir, host_link, every_family))
        if prev_result:
            conf["prevResult"] = draw(attachment_results(v, within=within, every_family=every_family)).to_json()
        return conf

    return build()


def conflists(
    types: Sequence[str] | None = None,
    *,
    version: str | None = None,
    name: str | None = None,
    within: Sequence[IPv4Network | IPv6Network] = TEST_SUBNETS,
    data_dir: str | None = None,
) -> st.SearchStrategy[dict[str, Any]]:
    """Conflists (decoded JSON) chaining ``types`` in order (when ``None``: an interface plugin,
    then some of portmap, firewall, tuning, bandwidth), each plugin valid for its type."""
    versions = st.sampled_from(VERSIONS) if version is None else st.just(version)
    chains = (
        st.just(list(types))
        if types is not None
        else st.tuples(
            st.sampled_from(["bridge", "ptp"]),
            st.lists(st.sampled_from(["portmap", "firewall", "tuning", "bandwidth"]), unique=True, max_size=3),
        ).map(lambda t: [t[0], *t[1]])
    )

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        v = draw(versions)
        plugins = [{"type": t, **draw(_options(t, within, data_dir))} for t in draw(chains)]
        return {"cniVersion": v, "name": name or draw(names), "plugins": plugins}

    return build()


@st.composite
def attachment_results(
    draw: st.DrawFn,
    version: str | None = None,
    *,
    ifname: str = "eth0",
    sandbox: str = "/run/netns/ctr",
    within: Sequence[IPv4Network | IPv6Network] = TEST_SUBNETS,
    every_family: bool = False,
) -> Result | Result040 | Result020:
    """A result as an interface plugin leaves it for the next in a chain (a ``prevResult``): a
    host veth and ``ifname`` in ``sandbox``, an address per family on it (one family of
    ``within`` or both; ``every_family``: each it has), a gateway, default routes."""
    v = draw(st.sampled_from(VERSIONS)) if version is None else version
    nets = draw(_family_nets(within, every_family))
    configs = []
    for net in nets:
        host = net[draw(st.integers(2, 250))]
        configs.append((ipaddress.ip_interface(f"{host}/{net.prefixlen}"), net[1]))
    default = {4: "0.0.0.0/0", 6: "::/0"}
    if v in Result020.VERSIONS:
        by_family = {
            a.version: IPConfig020(a, gw, [Route(ipaddress.ip_interface(default[a.version]))]) for a, gw in configs
        }
        return Result020(v, by_family.get(4), by_family.get(6), DNS())
    mac = draw(
        st.integers(0, 2**40 - 1).map(lambda n: "02:" + ":".join(f"{(n >> s) & 0xFF:02x}" for s in range(32, -1, -8)))
    )
    veth = Interface(f"veth{draw(st.integers(0, 2**32 - 1)):08x}", mac)
    ctr = Interface(ifname, mac, sandbox=sandbox)
    rts = [Route(ipaddress.ip_interface(default[a.version]), gw) for a, gw in configs]
    if v in Result040.VERSIONS:
        ips = [IPConfig040(str(a.version), a, gw, 1) for a, gw in configs]
        return Result040(v, [veth, ctr], ips, rts, DNS())
    return Result(v, [veth, ctr], [IPConfig(a, gw, 1) for a, gw in configs], rts, DNS())


# --- environment, CNI_ARGS and capability args ------------------------------------------------------

container_ids = st.from_regex(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]{0,63}", fullmatch=True)
ifnames = st.from_regex(r"[a-z][a-z0-9]{0,14}", fullmatch=True).filter(lambda n: n not in (".", ".."))
_arg_keys = st.sampled_from(["K8S_POD_NAME", "K8S_POD_NAMESPACE", "K8S_POD_INFRA_CONTAINER_ID"]) | (
    st.text(alphabet=string.ascii_letters + string.digits + "_", min_size=1, max_size=10).filter(
        lambda k: k.upper() not in ("IP", "MAC", "IGNOREUNKNOWN")  # values of these are checked
    )
)
_arg_values = st.text(alphabet=string.ascii_letters + string.digits + "-_./:", min_size=1, max_size=16)


# What an environment variable can hold: any UTF-8 but NUL (execve cannot pass it).
_env_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)


def cni_args(*, ignore_unknown: bool | None = None, hostile: bool = False) -> st.SearchStrategy[str]:
    """``CNI_ARGS`` strings (``K=V;K=V``). ``ignore_unknown`` True/False forces ``IgnoreUnknown=1``
    in or out (else either); ``hostile`` ones break the syntax (no ``=``, empty keys, ``;;``,
    control characters, a 70 000-byte value); every one can be passed in an environment."""
    pairs = st.lists(st.tuples(_arg_keys, _arg_values), max_size=4).map(lambda ps: [f"{k}={v}" for k, v in ps])
    flag = st.booleans() if ignore_unknown is None else st.just(ignore_unknown)
    valid = st.tuples(flag, pairs).map(lambda t: ";".join((["IgnoreUnknown=1"] if t[0] else []) + t[1]))
    if not hostile:
        return valid
    broken = st.sampled_from(["=", "a", ";", ";;", "=v", "k=", "a=b=c", "a=b;c", "\t=\n", "IgnoreUnknown=1;x"])
    return st.one_of(broken, _env_text, valid.map(lambda s: s + ";" + "x=" + "y" * 70_000))


def cni_environments(
    command: str | None = None,
    *,
    netns: str | st.SearchStrategy[str] = "/run/netns/ctr",
    path: str = "/opt/cni/bin",
    container_id: str | None = None,
    ifname: str | None = None,
    hostile: bool = False,
) -> st.SearchStrategy[dict[str, str]]:
    """``CNI_*`` environments for ``command`` (ADD, CHECK, DEL, GC, STATUS, VERSION; any when
    ``None``) as a runtime sets them, with ``CNI_ARGS`` sometimes. ``hostile`` ones have a
    variable missing, empty or invalid (a container ID with ``/``, a 16-byte ifname, ``..``);
    all are valid environments (no NUL, UTF-8), so they can be handed to ``execve``."""
    commands = (
        st.sampled_from(["ADD", "CHECK", "DEL", "GC", "STATUS", "VERSION"]) if command is None else st.just(command)
    )
    paths = netns if isinstance(netns, st.SearchStrategy) else st.just(netns)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, str]:
        env = {
            "CNI_COMMAND": draw(commands),
            "CNI_CONTAINERID": container_id or draw(container_ids),
            "CNI_NETNS": draw(paths),
            "CNI_IFNAME": ifname or draw(ifnames),
            "CNI_PATH": path,
        }
        if draw(st.booleans()):
            env["CNI_ARGS"] = draw(cni_args(hostile=hostile))
        if hostile:
            key = draw(st.sampled_from(sorted(env)))
            bad = {
                "CNI_COMMAND": ["", "add", "NOPE", "ADD "],
                "CNI_CONTAINERID": ["", "a/b", "-x", "a b", "x" * 5000],
                "CNI_NETNS": ["", "/nonexistent/netns", "/proc/self/ns/mnt", "relative"],
                "CNI_IFNAME": ["", ".", "..", "a/b", "a" * 16, "eth 0", "eth:0"],
                "CNI_PATH": ["", "/nonexistent", ":::"],
                "CNI_ARGS": ["=", ";;"],
            }[key]
            if draw(st.booleans()):
                del env[key]
            else:
                env[key] = draw(st.sampled_from(bad))
        return env

    return build()


def port_mappings(
    *, host_ips: st.SearchStrategy[str] | None = None, max_size: int = 4
) -> st.SearchStrategy[list[dict[str, Any]]]:
    """``portMappings`` (distinct host ports per protocol), ``hostIP`` sometimes."""
    host_ip = st.sampled_from(["", "0.0.0.0", "127.0.0.1", "::"]) if host_ips is None else host_ips
    mapping = st.fixed_dictionaries(
        {
            "hostPort": st.integers(1, 65535),
            "containerPort": st.integers(1, 65535),
            "protocol": st.sampled_from(["tcp", "udp", "sctp"]),
        },
        optional={"hostIP": host_ip},
    )
    return st.lists(mapping, max_size=max_size, unique_by=lambda m: (m["hostPort"], m["protocol"]))


def ip_ranges(
    within: Sequence[IPv4Network | IPv6Network] = TEST_SUBNETS,
) -> st.SearchStrategy[list[list[dict[str, Any]]]]:
    """``ipRanges`` as host-local reads them: one range set per family."""
    return _family_nets(within).flatmap(_ranges)


def _rates(max_rate: int, max_burst: int) -> st.SearchStrategy[dict[str, int]]:
    """bandwidth's limits: per direction a rate and a burst, both or neither (as the plugin requires),
    the burst at most a second of the rate (tc's 32-bit bucket time holds it)."""
    pair = st.integers(1000, max_rate).flatmap(lambda r: st.tuples(st.just(r), st.integers(1000, min(r, max_burst))))
    return st.tuples(st.none() | pair, st.none() | pair).map(
        lambda t: {
            **({"ingressRate": t[0][0], "ingressBurst": t[0][1]} if t[0] else {}),
            **({"egressRate": t[1][0], "egressBurst": t[1][1]} if t[1] else {}),
        }
    )


bandwidth = _rates(10**10, 10**8)
dns_capability = st.fixed_dictionaries(
    {},
    optional={
        "servers": st.lists(st.sampled_from(["198.18.0.1", "fd00:18::1", "192.0.2.53"]), max_size=3),
        "searches": st.lists(st.from_regex(r"[a-z]{1,8}(\.[a-z]{1,8}){0,2}", fullmatch=True), max_size=3),
        "options": st.lists(st.sampled_from(["ndots:2", "edns0", "rotate"]), max_size=2),
    },
)


def capability_args(
    capabilities: Sequence[str] = ("portMappings", "ipRanges", "bandwidth", "dns"),
    *,
    within: Sequence[IPv4Network | IPv6Network] = TEST_SUBNETS,
) -> st.SearchStrategy[dict[str, Any]]:
    """Runtime capability args (``runtimeConfig``) for some of ``capabilities``."""
    known = {
        "portMappings": port_mappings(),
        "ipRanges": ip_ranges(within),
        "bandwidth": bandwidth,
        "dns": dns_capability,
    }
    return st.fixed_dictionaries({}, optional={c: known[c] for c in capabilities if c in known})
