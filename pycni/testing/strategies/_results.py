"""Results of every spec version, JSON values, mutations of them and hostile bytes."""

from __future__ import annotations

import json
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Interface, IPv6Address, IPv6Interface
from typing import Any

from hypothesis import strategies as st

from ...types import DNS, AnyResult, Interface, IPConfig, IPConfig020, IPConfig040, Result, Result020, Result040, Route
from ...version import SUPPORTED

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
