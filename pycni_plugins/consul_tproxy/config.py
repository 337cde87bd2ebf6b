"""``CONSUL_IPTABLES_CONFIG``: Go's ``json.Unmarshal`` into consul/sdk's ``iptables.Config``, with
consul-cni's messages."""

from __future__ import annotations

from typing import Any

from pycni import _json
from pycni.types.consul import IptablesConfig

from .._common import fail

# Go field name, attribute, Go type. Keys match case-insensitively, as encoding/json does.
_FIELDS = (
    ("ConsulDNSIP", "consul_dns_ip", "string"),
    ("ConsulDNSPort", "consul_dns_port", "int"),
    ("ProxyUserID", "proxy_user_id", "string"),
    ("ProxyInboundPort", "proxy_inbound_port", "int"),
    ("ProxyOutboundPort", "proxy_outbound_port", "int"),
    ("ExcludeInboundPorts", "exclude_inbound_ports", "[]string"),
    ("ExcludeOutboundPorts", "exclude_outbound_ports", "[]string"),
    ("ExcludeOutboundCIDRs", "exclude_outbound_cidrs", "[]string"),
    ("ExcludeUIDs", "exclude_uids", "[]string"),
    ("NetNS", "netns", "string"),
    ("IptablesProvider", "", "iptables.Provider"),
)
_CONFIG_FIELDS = _json.GoFields(*(go for go, _, _ in _FIELDS))
_BY_NAME = {go: (go, attr, kind) for go, attr, kind in _FIELDS}
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _go_kind(value: Any, *, literal: bool = False) -> str:
    """What Go's ``UnmarshalTypeError`` calls a JSON value (numbers with their text for ints)."""
    if literal and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"number {value}"
    return _json.go_kind(value)


class _Mismatch(Exception):
    def __init__(self, value: Any, go_type: str) -> None:
        super().__init__(go_type)
        self.what = _go_kind(value, literal=go_type == "int")
        self.go_type = go_type


def _decode_field(value: Any, kind: str) -> Any:
    if kind == "string":
        if not isinstance(value, str):
            raise _Mismatch(value, "string")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or not _INT64[0] <= value <= _INT64[1]:
            raise _Mismatch(value, "int")
        return value
    if kind == "[]string":
        if not isinstance(value, list):
            raise _Mismatch(value, "[]string")
        out = []
        for item in value:
            if item is not None and not isinstance(item, str):
                raise _Mismatch(item, "string")
            out.append(item or "")  # null in a []string is ""
        return tuple(out)
    raise _Mismatch(value, kind)  # IptablesProvider: an interface, nothing decodes into it


def decode_config(text: str) -> IptablesConfig:
    """``json.Unmarshal`` of the CNI arg into ``iptables.Config`` (consul-cni's messages)."""
    try:
        raw = _json.loads(text)
    except _json.JSONDecodeFailure as e:
        raise fail(f"could not unmarshal CNI args: {e}") from None
    if raw is None:
        return IptablesConfig()
    if not isinstance(raw, dict):
        problem = f"json: cannot unmarshal {_go_kind(raw)} into Go value of type iptables.Config"
        raise fail(f"could not unmarshal CNI args: {problem}")
    values: dict[str, Any] = {}
    first: str | None = None
    for name, value in _CONFIG_FIELDS.pairs(raw):
        if value is None:  # unknown keys are ignored, null leaves the zero value
            continue
        go, attr, kind = _BY_NAME[name]
        try:
            values[attr] = _decode_field(value, kind)
        except _Mismatch as e:
            # Go keeps decoding and reports the earliest type error.
            first = first or f"json: cannot unmarshal {e.what} into Go struct field Config.{go} of type {e.go_type}"
    if first is not None:
        raise fail(f"could not unmarshal CNI args: {first}")
    return IptablesConfig(**values)
