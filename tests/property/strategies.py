"""Hypothesis strategies: valid results of every version, arbitrary JSON, and mutations of results."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Interface, IPv6Address, IPv6Interface
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from pycni.types import (
    DNS,
    Interface,
    IPConfig,
    IPConfig020,
    IPConfig040,
    Result,
    Result020,
    Result040,
    Route,
)

SETTINGS = settings(max_examples=200, deadline=None, database=None)

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


def current_results(*, interfaces: st.SearchStrategy[Interface] = current_interfaces) -> st.SearchStrategy[Result]:
    return st.builds(
        Result,
        st.sampled_from(Result.VERSIONS),
        st.lists(interfaces, max_size=3),
        st.lists(st.builds(IPConfig, interfaces_, st.none() | addresses, optional_ints), max_size=4),
        st.lists(routes(), max_size=4),
        dns,
    )


def _labelled(address: IPv4Interface | IPv6Interface) -> str:
    return "4" if address.version == 4 else "6"


def results_040(*, consistent_labels: bool = False) -> st.SearchStrategy[Result040]:
    """0.3.x/0.4.0 results; ``consistent_labels`` makes each ip's version match its address."""
    if consistent_labels:
        ips = st.builds(
            lambda a, g, i: IPConfig040(_labelled(a), a, g, i), interfaces_, st.none() | addresses, optional_ints
        )
    else:
        ips = st.builds(IPConfig040, ip_labels, interfaces_, st.none() | addresses, optional_ints)
    return st.builds(
        Result040,
        st.sampled_from(Result040.VERSIONS),
        st.lists(short_interfaces, max_size=3),
        st.lists(ips, max_size=4),
        st.lists(routes(), max_size=4),
        dns,
    )


def results_020(*, convertible: bool = False) -> st.SearchStrategy[Result020]:
    """0.1.0/0.2.0 results; ``convertible`` ones survive a trip up and back down unchanged:
    at least one config, and each config's routes are short and of its own family."""
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
        return st.builds(lambda v, p, d: Result020(v, p[0], p[1], d), st.sampled_from(Result020.VERSIONS), pair, dns)
    config = st.builds(IPConfig020, interfaces_, st.none() | addresses, st.lists(routes(), max_size=3))
    return st.builds(Result020, st.sampled_from(Result020.VERSIONS), st.none() | config, st.none() | config, dns)


any_results = current_results() | results_040() | results_020()

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
# Values that look like what a result holds, so mutations also hit the near-misses.
plausible_leaves = st.sampled_from(
    ["", "4", "6", "1.0.0", "0.4.0", "10.0.0.1", "10.0.0.1/24", "::1/128", "::ffff:1.2.3.4/120", "01.2.3.4/8"]
    + ["fe80::1%eth0/64", "\ud800", "a\udfffb", "\u017fcope"]
) | st.sampled_from([0, -1, 1.5, 2**63, 2**64, True, None, [], {}])
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
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {**node, head: replaced(node[head], rest, value)}
    return [replaced(item, rest, value) if i == head else item for i, item in enumerate(node)]


@st.composite
def mutated_results(draw: st.DrawFn) -> Any:
    """A valid result's JSON with one to three nodes replaced: mostly leaves, but any node (the
    root too) can go."""
    doc = draw(any_results).to_json()
    for _ in range(draw(st.integers(1, 3))):
        nodes, leaves = paths_of(doc)
        path = draw(st.sampled_from(leaves) | st.sampled_from(nodes) if leaves else st.sampled_from(nodes))
        doc = replaced(doc, path, draw(replacements))
    return doc


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
