"""Hostile allocation / node / result JSON: only CNIError subclasses come out, never another exception."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from pycni.cli.nomad import nomad
from pycni.errors import CNIError
from pycni.nomad.args import cni_args
from pycni.nomad.models import Allocation, Node
from pycni.nomad.ports import port_mappings
from pycni.nomad.status import alloc_net_status, result_from_json
from pycni.nomad.tproxy import transparent_proxy_config

from .conftest import FIXTURES, fixture_json

SETTINGS = settings(max_examples=300, deadline=None, database=None)

hostile_text = st.text(
    alphabet=st.characters(codec=None, categories=None, exclude_categories=()) | st.sampled_from('\x00\n;="\\<&\ud800'),
    max_size=20,
)
hostile_ints = st.integers(-(2**70), 2**70) | st.sampled_from([0, -1, 65535, 65536, 2**31, 2**63, -(2**63) - 1])
leaves = st.none() | st.booleans() | hostile_ints | st.floats(allow_nan=False, allow_infinity=False) | hostile_text
json_values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
    max_leaves=20,
)

BASES = [fixture_json(name) for name in ("connect_tproxy_alloc.json", "bridge_ports_alloc.json")]
NODE = fixture_json("node.json")


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*prefix, i))
    return out


BASE_PATHS = [paths(base) for base in BASES]


@st.composite
def mutated(draw: st.DrawFn) -> Any:
    """A real allocation with a few of its values (anywhere, the root included) replaced."""
    index = draw(st.integers(0, len(BASES) - 1))
    doc = json.loads(json.dumps(BASES[index]))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(BASE_PATHS[index]))
        replacement = draw(json_values)
        if not path:
            return replacement
        target = doc
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = replacement
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation already replaced an ancestor
    return doc


def run_pipeline(doc: Any, node_doc: Any = NODE) -> None:
    try:
        alloc = Allocation.from_json(doc)
        node = Node.from_json(node_doc)
        ports = port_mappings(alloc, ignore_host_ip=False)
        tproxy = transparent_proxy_config(alloc, node, "/var/run/netns/x", ports)
        args = cni_args(alloc, tproxy)
        # Everything must be printable as UTF-8: no lone surrogate survives decoding.
        json.dumps([p.to_json() for p in ports], ensure_ascii=False).encode("utf-8")
        json.dumps(args, ensure_ascii=False).encode("utf-8")
    except CNIError:
        pass


@SETTINGS
@given(mutated())
def test_mutated_allocations_fail_only_with_cni_errors(doc: Any) -> None:
    run_pipeline(doc)


@SETTINGS
@given(json_values)
def test_arbitrary_json_as_allocation_or_node(doc: Any) -> None:
    run_pipeline(doc)
    run_pipeline(BASES[0], doc)


@SETTINGS
@given(st.binary(max_size=200) | hostile_text.map(lambda s: s.encode("utf-8", "surrogatepass")))
def test_arbitrary_bytes(data: bytes) -> None:
    try:
        Allocation.loads(data)
    except CNIError:
        pass


def test_deep_nesting_and_huge_numbers_in_text() -> None:
    for text in ("[" * 100_000 + "]" * 100_000, '{"ID": ' + "9" * 10_000 + "}", '{"Job": {"TaskGroups": 1e400}}'):
        try:
            Allocation.loads(text)
        except CNIError:
            pass


def test_deep_nesting_inside_an_ignored_field() -> None:
    doc = json.loads(json.dumps(BASES[1]))
    deep: Any = []
    for _ in range(50_000):
        deep = [deep]
    doc["Job"]["Meta"] = deep
    assert Allocation.from_json(doc).group.name == "frontend"


@SETTINGS
@given(json_values | st.fixed_dictionaries({"Interfaces": json_values, "DNS": json_values}))
def test_arbitrary_results_fail_only_with_cni_errors(doc: Any) -> None:
    try:
        alloc_net_status(result_from_json(doc))
    except CNIError:
        pass


@settings(max_examples=60, deadline=None, database=None)
@given(mutated())
def test_cli_never_shows_a_traceback(doc: Any) -> None:
    runner = CliRunner()
    text = json.dumps(doc, ensure_ascii=True)
    node = str(FIXTURES / "node.json")
    for args in (["ports", "--alloc", "-"], ["cni-args", "--alloc", "-", "--node", node, "--netns", "/x"]):
        result = runner.invoke(nomad, args, input=text)
        assert result.exit_code in (0, 1, 2), result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
