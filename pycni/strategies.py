"""Hypothesis strategies for CNI: results of every spec version, hostile mutations of them,
network configs and conflists, ``CNI_*`` environments and capability args.

Install with ``pip install 'pycni[fuzz]'``. Everything here is a plain hypothesis strategy, so
it composes with ``@given``, ``.map`` and ``st.one_of``::

    from hypothesis import given
    from pycni import strategies as cs

    @given(cs.results(version="0.4.0").map(lambda r: r.to_json()))
    def test_my_parser_reads_every_0_4_0_result(doc): ...

Valid values are what the spec and libcni accept; *mutations* are near misses (a member of the
wrong type, missing, out of range, huge) and *hostile bytes* are what no JSON encoder writes
(invalid UTF-8, 100 000-deep nesting, duplicate keys, 400-digit numbers, NaN, truncation).
Addresses in configs and capability args come from 198.18.0.0/15 and fd00:18::/48 (benchmarking
and ULA space) unless you pass other ``subnets``; host-local's ``dataDir`` is set only when you
pass ``data_dir`` (else the plugin's default, /var/lib/cni/networks, applies).
"""

from __future__ import annotations

try:
    from hypothesis import strategies as st
except ImportError as e:  # pragma: no cover - exercised by a test in a subprocess
    raise ImportError("pycni.strategies needs hypothesis, which is not installed: pip install 'pycni[fuzz]'") from e

import ipaddress
import json
import string
from collections.abc import Callable, Sequence
from ipaddress import IPv4Address, IPv4Interface, IPv4Network, IPv6Address, IPv6Interface, IPv6Network
from typing import Any

from .types import DNS, AnyResult, Interface, IPConfig, IPConfig020, IPConfig040, Result, Result020, Result040, Route
from .version import SUPPORTED

__all__ = [
    # results
    "VERSIONS",
    "results",
    "any_results",
    "current_results",
    "results_040",
    "results_020",
    "attachment_results",
    "current_interfaces",
    "short_interfaces",
    "routes",
    "dns",
    # JSON and mutations
    "json_strings",
    "json_values",
    "mutations",
    "mutated",
    "mutated_results",
    "text_field_mutations",
    "hostile_bytes",
    "paths_of",
    "replaced",
    # configs
    "PLUGIN_TYPES",
    "HOST_LINK",
    "TEST_SUBNETS",
    "subnets",
    "network_configs",
    "conflists",
    # environment and runtime args
    "container_ids",
    "ifnames",
    "cni_args",
    "cni_environments",
    "port_mappings",
    "ip_ranges",
    "bandwidth",
    "dns_capability",
    "capability_args",
]

VERSIONS: tuple[str, ...] = SUPPORTED

# --- results ------------------------------------------------------------------------------------

go_ints = st.integers(-(2**63), 2**63 - 1)
small_ints = st.integers(-2, 70_000) | go_ints
optional_ints = st.none() | small_ints
texts = st.text(max_size=12)

ipv4_addresses = st.integers(0, 2**32 - 1).map(IPv4Address)
# Go treats IPv4-mapped IPv6 as IPv4, so a valid IPv6 value is never one.
ipv6_addresses = st.integers(0, 2**128 - 1).map(IPv6Address).filter(lambda a: a.ipv4_mapped is None)
ipv4_interfaces = st.builds(lambda a, p: IPv4Interface((a, p)), ipv4_addresses, st.integers(0, 32))
ipv6_interfaces = st.builds(lambda a, p: IPv6Interface((a, p)), ipv6_addresses, st.integers(0, 128))
addresses = ipv4_addresses | ipv6_addresses
interfaces_ = ipv4_interfaces | ipv6_interfaces


def routes(dst: st.SearchStrategy[Any] = interfaces_, *, short: bool = False) -> st.SearchStrategy[Route]:
    """Routes to ``dst``; ``short`` ones carry only dst/gw (all a 0.1.0/0.2.0 conversion keeps)."""
    if short:
        return st.builds(Route, dst, st.none() | addresses)
    return st.builds(
        Route, dst, st.none() | addresses, small_ints, small_ints, small_ints, optional_ints, optional_ints
    )


dns = st.builds(DNS, st.lists(texts, max_size=3), texts, st.lists(texts, max_size=3), st.lists(texts, max_size=3))
current_interfaces = st.builds(Interface, texts, texts, small_ints, texts, texts, texts)
short_interfaces = st.builds(lambda n, m, s: Interface(n, m, sandbox=s), texts, texts, texts)
ip_labels = st.sampled_from(["4", "6"]) | texts  # libcni keeps any string


def _versions(version: str | None, model: type[AnyResult]) -> st.SearchStrategy[str]:
    return st.sampled_from(model.VERSIONS) if version is None else st.just(version)


def current_results(
    *, interfaces: st.SearchStrategy[Interface] = current_interfaces, version: str | None = None
) -> st.SearchStrategy[Result]:
    """1.0.0/1.1.0 results (``version`` pins one)."""
    return st.builds(
        Result,
        _versions(version, Result),
        st.lists(interfaces, max_size=3),
        st.lists(st.builds(IPConfig, interfaces_, st.none() | addresses, optional_ints), max_size=4),
        st.lists(routes(), max_size=4),
        dns,
    )


def _labelled(address: IPv4Interface | IPv6Interface) -> str:
    return "4" if address.version == 4 else "6"


def results_040(*, consistent_labels: bool = False, version: str | None = None) -> st.SearchStrategy[Result040]:
    """0.3.x/0.4.0 results; ``consistent_labels`` makes each ip's version match its address."""
    if consistent_labels:
        ips = st.builds(
            lambda a, g, i: IPConfig040(_labelled(a), a, g, i), interfaces_, st.none() | addresses, optional_ints
        )
    else:
        ips = st.builds(IPConfig040, ip_labels, interfaces_, st.none() | addresses, optional_ints)
    return st.builds(
        Result040,
        _versions(version, Result040),
        st.lists(short_interfaces, max_size=3),
        st.lists(ips, max_size=4),
        st.lists(routes(), max_size=4),
        dns,
    )


def results_020(*, convertible: bool = False, version: str | None = None) -> st.SearchStrategy[Result020]:
    """0.1.0/0.2.0 results; ``convertible`` ones survive a trip up and back down unchanged:
    at least one config, and each config's routes are short and of its own family."""
    versions = _versions(version, Result020)
    if convertible:
        ip4 = st.builds(
            IPConfig020,
            ipv4_interfaces,
            st.none() | addresses,
            st.lists(routes(ipv4_interfaces, short=True), max_size=3),
        )
        ip6 = st.builds(
            IPConfig020,
            ipv6_interfaces,
            st.none() | addresses,
            st.lists(routes(ipv6_interfaces, short=True), max_size=3),
        )
        pair = st.tuples(st.none() | ip4, st.none() | ip6).filter(lambda p: p != (None, None))
        return st.builds(lambda v, p, d: Result020(v, p[0], p[1], d), versions, pair, dns)
    config = st.builds(IPConfig020, interfaces_, st.none() | addresses, st.lists(routes(), max_size=3))
    return st.builds(Result020, versions, st.none() | config, st.none() | config, dns)


any_results = current_results() | results_040() | results_020()


def results(version: str | None = None) -> st.SearchStrategy[Result | Result040 | Result020]:
    """Valid results of spec ``version`` (any of :data:`VERSIONS` when ``None``), as the model
    objects of :mod:`pycni.types` (``.to_json()`` gives the wire form)."""
    if version is None:
        return any_results
    for model, build in ((Result, current_results), (Result040, results_040), (Result020, results_020)):
        if version in model.VERSIONS:
            return build(version=version)
    raise ValueError(f"unknown CNI version {version!r}; choose from {', '.join(VERSIONS)}")


# --- JSON, mutations and hostile bytes ------------------------------------------------------------

# JSON leaves include lone surrogates (as from "\ud800" escapes) and non-finite floats, which only
# reach the parser through already-decoded input.
# (Built from a list: hypothesis merges a union of characters() alphabets and drops the surrogates.)
json_strings = st.text(max_size=20) | st.lists(
    st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=20
).map("".join)
json_leaves = st.none() | st.booleans() | st.integers() | st.floats() | json_strings
json_values = st.recursive(
    json_leaves,
    # Non-string keys only arrive through already-decoded input (json.dumps turns them into strings).
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(json_strings | st.integers() | st.none(), children, max_size=4)
    ),
    max_leaves=20,
)
# Values that look like what a result or config holds, so mutations also hit the near-misses:
# addresses that almost parse, indexes and ports just out of range, integers past int64.
plausible_leaves: st.SearchStrategy[Any] = st.sampled_from(
    ["", "4", "6", "1.0.0", "0.4.0", "10.0.0.1", "10.0.0.1/24", "::1/128", "::ffff:1.2.3.4/120", "01.2.3.4/8"]
    + ["fe80::1%eth0/64", "\ud800", "a\udfffb", "\u017fcope", "tcp", "TCP", "eth0", "../x", "a" * 300]
) | st.sampled_from([0, -1, 1.5, 2**31, 2**63, 2**64, -(2**63) - 1, 65536, 10**30, True, None, [], {}])
replacements = st.one_of(plausible_leaves, json_strings, json_values)


def paths_of(node: Any, prefix: tuple[Any, ...] = ()) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(every node's path, the leaves' paths)."""
    if isinstance(node, dict):
        children = [paths_of(value, prefix + (key,)) for key, value in node.items()]
    elif isinstance(node, list):
        children = [paths_of(value, prefix + (index,)) for index, value in enumerate(node)]
    else:
        return [prefix], [prefix]
    return [prefix] + [p for nodes, _ in children for p in nodes], [p for _, leaves in children for p in leaves]


def replaced(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    """``node`` with the value at ``path`` replaced (a copy; ``node`` is unchanged)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {**node, head: replaced(node[head], rest, value)}
    return [replaced(item, rest, value) if i == head else item for i, item in enumerate(node)]


def _removed(node: Any, path: tuple[Any, ...]) -> Any:
    head, rest = path[0], path[1:]
    if rest:
        return replaced(node, (head,), _removed(node[head], rest))
    if isinstance(node, dict):
        return {k: v for k, v in node.items() if k != head}
    return [item for i, item in enumerate(node) if i != head]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


@st.composite
def mutations(draw: st.DrawFn, doc: Any, *, max_mutations: int = 3) -> Any:
    """``doc`` (decoded JSON) with one to ``max_mutations`` edits: a node replaced (mostly leaves,
    but any node, the root too, by a near-miss or any JSON), a member or item removed, an index
    pushed out of range, or an unknown member added."""
    for _ in range(draw(st.integers(1, max_mutations))):
        nodes, leaves = paths_of(doc)
        kind = draw(st.sampled_from(["replace", "replace", "replace", "remove", "index", "add"]))
        if kind == "remove" and len(nodes) > 1:
            doc = _removed(doc, draw(st.sampled_from(nodes[1:])))
        elif kind == "index" and (numbers := [p for p in leaves if _is_int(_get(doc, p))]):
            # an index ("interface": 1), port or MTU pushed out of its range
            doc = replaced(doc, draw(st.sampled_from(numbers)), draw(st.sampled_from([-1, 2**31, 2**63, len(nodes)])))
        elif kind == "add" and any(isinstance(_get(doc, p), dict) for p in nodes):
            path = draw(st.sampled_from([p for p in nodes if isinstance(_get(doc, p), dict)]))
            doc = replaced(doc, path, {**_get(doc, path), draw(json_strings): draw(replacements)})
        else:
            path = draw(st.sampled_from(leaves) | st.sampled_from(nodes) if leaves else st.sampled_from(nodes))
            doc = replaced(doc, path, draw(replacements))
    return doc


def mutated(docs: st.SearchStrategy[Any], *, max_mutations: int = 3) -> st.SearchStrategy[Any]:
    """Near-valid variants of the decoded JSON ``docs`` draws (see :func:`mutations`)."""
    return docs.flatmap(lambda doc: mutations(doc, max_mutations=max_mutations))


def mutated_results() -> st.SearchStrategy[Any]:
    """A valid result's JSON (any version) with one to three nodes replaced, removed or added."""
    return mutated(any_results.map(lambda r: r.to_json()))


_TEXT_KEYS = {"name", "mac", "sandbox", "socketPath", "pciID", "domain", "version"}
_TEXT_LISTS = {"nameservers", "search", "options"}


@st.composite
def text_field_mutations(draw: st.DrawFn) -> Any:
    """A valid result's JSON with one free-text field (name, mac, dns entries...) set to any string."""
    doc = draw(any_results.filter(lambda r: _text_paths(r.to_json())).map(lambda r: r.to_json()))
    return replaced(doc, draw(st.sampled_from(_text_paths(doc))), draw(json_strings))


def _text_paths(doc: Any) -> list[tuple[Any, ...]]:
    return [
        p
        for p in paths_of(doc)[1]
        if (isinstance(p[-1], str) and p[-1] in _TEXT_KEYS) or (len(p) > 1 and p[-2] in _TEXT_LISTS)
    ]


def _dump(node: Any, path: tuple[Any, ...], at: tuple[Any, ...], edit: Callable[[Any, bytes], bytes]) -> bytes:
    """Compact JSON of ``node`` where the node at ``at`` is written by ``edit(value, its_json)``."""
    if isinstance(node, dict):
        out = b"{" + b",".join(_pair(k, _dump(v, (*path, k), at, edit)) for k, v in node.items()) + b"}"
    elif isinstance(node, list):
        out = b"[" + b",".join(_dump(v, (*path, i), at, edit) for i, v in enumerate(node)) + b"]"
    else:
        out = json.dumps(node, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return edit(node, out) if path == at else out


def _pair(key: Any, value: bytes) -> bytes:
    return json.dumps(str(key), ensure_ascii=False).encode("utf-8", "surrogatepass") + b":" + value


_BAD_UTF8 = [b"\xff", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80", b"\xe2\x82"]
_HUGE_NUMBERS = [b"1" + b"0" * 400, b"-" + b"9" * 400, b"1e400", b"-1e400", b"1e-400", b"18446744073709551616"]
_NON_JSON = [b"NaN", b"Infinity", b"-Infinity", b"undefined", b"0x10", b"01", b"+1", b".5", b"'a'"]


@st.composite
def _hostile_encoding(draw: st.DrawFn, doc: Any) -> bytes:
    nodes, _ = paths_of(doc)
    at = draw(st.sampled_from(nodes))
    kind = draw(st.sampled_from(["utf8", "nesting", "duplicate", "number", "literal", "truncate", "wrap"]))
    if kind == "utf8":
        bad = draw(st.sampled_from(_BAD_UTF8))
        strings = [p for p in nodes if isinstance(_get(doc, p), str)]
        if strings:  # inside a string value, where a decoder must notice it
            return _dump(doc, (), draw(st.sampled_from(strings)), lambda v, out: out[:1] + bad + out[1:])
        data = _dump(doc, (), (), lambda v, out: out)
        cut = draw(st.integers(0, len(data)))
        return data[:cut] + bad + data[cut:]
    if kind == "nesting":
        depth = draw(st.sampled_from([64, 1000, 100_000]))
        opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
        return _dump(doc, (), at, lambda v, out: opener * depth + out + closer * depth)
    if kind == "duplicate":
        objects = [p for p in nodes if isinstance(_get(doc, p), dict) and _get(doc, p)]
        if objects:
            at = draw(st.sampled_from(objects))
            key = draw(st.sampled_from(list(_get(doc, at))))
            extra = _pair(key, json.dumps(draw(plausible_leaves | json_leaves)).encode())
            # one copy before the original, as a later one wins in Go and in Python alike
            return _dump(doc, (), at, lambda v, out: b"{" + extra + b"," + out[1:])
        kind = "number"
    if kind == "number":
        return _dump(doc, (), at, lambda v, out: draw(st.sampled_from(_HUGE_NUMBERS)))
    if kind == "literal":
        return _dump(doc, (), at, lambda v, out: draw(st.sampled_from(_NON_JSON)))
    data = _dump(doc, (), (), lambda v, out: out)
    if kind == "truncate":
        return data[: draw(st.integers(0, max(0, len(data) - 1)))]
    prefix, suffix = draw(
        st.sampled_from(
            [(b"\xef\xbb\xbf", b""), (b"", b"\x00"), (b"", b"}"), (b"", b" {}"), (b"\x00", b""), (b"", b"\n\n")]
        )
    )
    return prefix + data + suffix


def hostile_bytes(docs: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """The decoded JSON ``docs`` draws, serialised hostilely: invalid UTF-8 in a string, a node
    nested 64 to 100 000 deep, a duplicate key, a 400-digit or out-of-range number, a non-JSON
    literal (NaN, 0x10), truncation, a BOM or trailing bytes."""
    return docs.flatmap(_hostile_encoding)


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
