"""Hypothesis strategies for CNI: results of every spec version, hostile mutations of them,
network configs and conflists, ``CNI_*`` environments and capability args.

Install with ``pip install 'pycni[fuzz]'`` (``pycni.strategies``, the path this module was first
published under, re-exports it). Everything here is a plain hypothesis strategy, so it composes
with ``@given``, ``.map`` and ``st.one_of``::

    from hypothesis import given
    from pycni.testing import strategies as cs

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

try:  # first, so a missing hypothesis is one clear message, not a failure deep in a submodule
    import hypothesis  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised by a test in a subprocess
    raise ImportError(
        "pycni.testing.strategies needs hypothesis, which is not installed: pip install 'pycni[fuzz]'"
    ) from e

from ._configs import (
    HOST_LINK,
    PLUGIN_TYPES,
    TEST_SUBNETS,
    attachment_results,
    bandwidth,
    capability_args,
    cni_args,
    cni_environments,
    conflists,
    container_ids,
    dns_capability,
    ifnames,
    ip_ranges,
    network_configs,
    port_mappings,
    subnets,
)
from ._results import (
    VERSIONS,
    any_results,
    current_interfaces,
    current_results,
    dns,
    hostile_bytes,
    json_strings,
    json_values,
    mutated,
    mutated_results,
    mutations,
    paths_of,
    replaced,
    results,
    results_020,
    results_040,
    routes,
    short_interfaces,
    text_field_mutations,
)

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
