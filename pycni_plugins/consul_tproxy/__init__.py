"""consul-cni in process: Consul's transparent-proxy redirection, as nftables, in the container.

What it replaces
----------------
Nomad appends ``{"type": "consul-cni"}`` to the bridge conflist of a group whose sidecar has
``transparent_proxy`` and passes the proxy settings as JSON in ``CNI_ARGS``
(``CONSUL_IPTABLES_CONFIG``, Consul's ``iptables.Config``). consul-cni (consul-k8s
``control-plane/cni``) decodes it and runs consul/sdk ``iptables.Setup(cfg, dualStack=false)``:
about 20 ``iptables -t nat`` commands, one process each, through ``nsenter --net=<CNI_NETNS>``,
not atomic. This plugin reads the same arguments, fails with the same messages, passes the
prevResult through the same way, and installs rules with the same effect and evaluation order
as **one nftables transaction in the container's namespace**, in its own table
``table ip pycni_tproxy`` (IPv4 only, like Consul's IPv4 pass; Nomad never asks for dual stack).

The rules, Consul's one by one, are in :mod:`.rules`; the config's decoding in :mod:`.config`;
CHECK's comparison in :mod:`.compare`.

Differences from consul-cni, on purpose
---------------------------------------
* Atomic and repeatable: the transaction replaces the whole table (``add``/``delete``/``add``),
  so a retried ADD neither fails on "Chain already exists" nor leaves half a rule set.
* DEL removes the table when the namespace still exists (a gone namespace is fine); consul-cni's
  DEL is a no-op. CHECK verifies the table: its chains and base-chain hooks, every chain's rules
  in order (by their comments, which carry the ports, addresses and UIDs) and the sets'
  elements, naming the first difference; consul-cni's CHECK is a no-op. A rule whose body was
  edited in place but kept its comment is not detected. Without ``CONSUL_IPTABLES_CONFIG``
  (a runtime that passes no args to CHECK) only the chains are checked.
* Only Nomad's path: without ``CONSUL_IPTABLES_CONFIG``, consul-cni would read the rules from a
  Kubernetes pod annotation; that is refused here with an explicit error.
* No prevResult: consul-cni fakes a result labelled ``0.3.1`` (which Go prints only for a 0.3.1
  config); here the empty result is printed at the config's version.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

import attrs

from pycni import _json, netns
from pycni.errors import CNIError, ErrorCode
from pycni.sdk import Plugin, PluginRequest
from pycni.types import parse_result

from .._common import emit, fail, in_netns, netns_gone, prev_result
from ..kernel import nft
from .compare import verify
from .config import _go_kind, decode_config
from .rules import _SETUP, _T, DEFAULT_OUTBOUND_PORT, FAMILY, TABLE, Ruleset, ruleset

__all__ = [
    "ConsulTproxyPlugin",
    "Ruleset",
    "decode_config",
    "ruleset",
    "verify",
    "FAMILY",
    "TABLE",
    "DEFAULT_OUTBOUND_PORT",
]

KNOWN_ARGS = ("IP", "K8S_POD_NAME", "K8S_POD_NAMESPACE", "K8S_POD_INFRA_CONTAINER_ID", "CONSUL_IPTABLES_CONFIG")


def _check_conf(config: Mapping[str, Any]) -> None:
    """consul-cni's ``parseConfig`` type checks (its ``PluginConf``; unknown keys are ignored)."""
    checks = (
        ("cniVersion", str, "string"),
        ("name", str, "string"),
        ("type", str, "string"),
        ("cni_bin_dir", str, "string"),
        ("cni_net_dir", str, "string"),
        ("kubeconfig", str, "string"),
        ("log_level", str, "string"),
        ("multus", bool, "bool"),
        ("runtime_config", dict, "struct {}"),
    )
    for key, typ, go in checks:
        value = _json.go_field(config, key)
        if value is None or (isinstance(value, typ) and (typ is bool or not isinstance(value, bool))):
            continue
        raise fail(
            "failed to parse network configuration: "
            f"json: cannot unmarshal {_go_kind(value)} into Go struct field PluginConf.{key} of type {go}"
        )


def _load_args(request: PluginRequest) -> dict[str, str]:
    """``types.LoadArgs`` into consul-cni's ``CNIArgs``; ``IP`` is a ``net.IP`` (parsed in place)."""
    for pair in request.args.split(";") if request.args else ():
        parts = pair.split("=")
        if len(parts) != 2 or parts[0] == "IgnoreUnknown":
            break  # load_args reports these (in order, as Go does)
        if parts[0] == "IP" and parts[1]:
            try:
                if "%" in parts[1]:
                    raise ValueError(parts[1])
                ipaddress.ip_address(parts[1])
            except ValueError:
                raise fail(
                    f"ARGS: error parsing value of pair {_json.dumps_compact(pair)}: invalid IP address: {parts[1]}"
                ) from None
    return request.load_args(*KNOWN_ARGS)


def _raw_config(request: PluginRequest) -> str:
    """``CONSUL_IPTABLES_CONFIG`` after consul-cni's argument checks ("" = none, on CHECK only)."""
    args = _load_args(request)
    raw = args.get("CONSUL_IPTABLES_CONFIG", "")
    if raw:
        return raw
    if not (args.get("K8S_POD_NAMESPACE") and args.get("K8S_POD_NAME")):
        if request.command == "CHECK":
            return ""
        raise fail("not running in a pod, namespace and pod should have values")
    raise fail(
        "pycni's consul-cni serves only Nomad (CONSUL_IPTABLES_CONFIG in CNI_ARGS): "
        f"Kubernetes pod {args['K8S_POD_NAMESPACE']}/{args['K8S_POD_NAME']} is not supported"
    )


def _require_netns(request: PluginRequest) -> None:
    # skel's check, before the plugin runs; without it Consul's executor would use *this* netns.
    if not request.netns:
        raise CNIError("required env variables [CNI_NETNS] missing", code=ErrorCode.INVALID_ENVIRONMENT_VARIABLES)


def _prev(request: PluginRequest) -> Any:
    try:
        return prev_result(request)
    except CNIError as e:
        raise fail(f"could not parse prevResult: {e.msg}", e.details) from e


def _list_table() -> list[dict[str, Any]] | None:
    return nft.list_table(FAMILY, TABLE)


def _remove_table() -> None:
    nft.run([f"add table {_T}", f"delete table {_T}"])


class ConsulTproxyPlugin(Plugin):
    """``consul-cni`` (Nomad's path) with nftables instead of iptables."""

    type = "consul-cni"

    def validate(self, request: PluginRequest) -> None:
        _require_netns(request)
        _check_conf(request.config)
        ruleset(decode_config(_raw_config(request)))

    def add(self, request: PluginRequest) -> dict[str, Any]:
        # consul-cni's order: config, args, pod check, prevResult, the tproxy JSON, Setup.
        _require_netns(request)
        _check_conf(request.config)
        prev = _prev(request)
        raw = _raw_config(request)
        if prev is not None and not prev.ips:
            raise fail("got no container IPs")
        cfg = attrs.evolve(decode_config(raw), netns=request.netns)  # CNI_NETNS wins over the JSON's
        rules = ruleset(cfg)
        try:
            in_netns(request.netns, nft.run, rules.commands())
        except nft.NftError as e:
            raise fail(f"{_SETUP}: {e.msg}", e.details) from e
        if prev is None:
            return parse_result({"cniVersion": request.cni_version}).to_json()
        return emit(prev, request)

    def check(self, request: PluginRequest) -> None:
        _require_netns(request)
        _check_conf(request.config)
        raw = _raw_config(request)
        expected = ruleset(decode_config(raw)) if raw else None
        try:
            objects = in_netns(request.netns, _list_table)
        except nft.NftError as e:
            raise fail(f"consul-cni: cannot list table {_T}: {e.msg}", e.details) from e
        problem = verify(objects, expected)
        if problem is not None:
            raise fail(f"consul-cni: {problem} in netns {request.netns}")

    def delete(self, request: PluginRequest) -> None:
        # consul-cni's DEL is a no-op; removing the table matters when the namespace outlives it.
        if not request.netns:
            return
        try:
            netns.run_in(request.netns, _remove_table)
        except netns.NetnsError as e:
            if netns_gone(e):
                return
            raise fail(str(e)) from e
        except nft.NftError as e:
            raise fail(f"consul-cni: failed to remove {FAMILY} {TABLE}: {e.msg}", e.details) from e
