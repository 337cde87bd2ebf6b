"""The ``portMappings`` capability entry, as it crosses from a runtime to the portmap plugin.

One entry is go-cni's ``cni.PortMapping`` / the reference portmap's ``PortMapEntry``
(``hostPort``, ``containerPort``, ``protocol``, ``hostIP``): go-cni and the Nomad configurator
build and emit it, the portmap plugin decodes and validates it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .._json import GoFields
from ..errors import CNIError, ErrorCode

__all__ = ["PORT_PROTOCOLS", "PortMapping"]

#: The protocols the portmap plugin publishes (``protocol`` is matched case-insensitively).
PORT_PROTOCOLS = ("tcp", "udp", "sctp")


def _port(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536


@attrs.frozen
class PortMapping:
    """One mapping. The constructor takes what the caller has, unchecked, as Go's struct does
    (Nomad wraps port numbers to int32); :meth:`from_json` is the plugin side's strict decoder."""

    host_port: int
    container_port: int
    protocol: str = "tcp"
    host_ip: str = ""

    def to_json(self) -> dict[str, Any]:
        """The capability entry (``hostIP`` only when set, as the portmap plugin reads it)."""
        out: dict[str, Any] = {
            "hostPort": self.host_port,
            "containerPort": self.container_port,
            "protocol": self.protocol,
        }
        if self.host_ip:
            out["hostIP"] = self.host_ip
        return out

    @classmethod
    def from_json(cls, entry: Any) -> PortMapping:
        """Decode one entry with Go's field matching (``hostPort`` and ``HostPort`` both work),
        with the reference portmap's checks and messages (code 999); a missing ``protocol`` is
        tcp, and the protocol comes back lower-cased. ``hostIP`` is checked to be a string only:
        what address it names is the plugin's business."""
        if not isinstance(entry, Mapping):
            raise _invalid("failed to parse config: invalid port mapping")
        fields = _MAPPING_FIELDS.pick(entry)  # one pass over the keys (none: already field names)
        host_port: Any = fields.get("hostPort")
        container_port: Any = fields.get("containerPort")
        protocol = fields.get("protocol") or "tcp"
        host_ip = fields.get("hostIP") or ""
        if not _port(container_port):
            raise _invalid(f"Invalid container port number: {container_port}")
        if not _port(host_port):
            raise _invalid(f"Invalid host port number: {host_port}")
        if not isinstance(protocol, str) or protocol.lower() not in PORT_PROTOCOLS:
            raise _invalid(f'unknown protocol "{protocol}"')
        if not isinstance(host_ip, str):
            raise _invalid(f'invalid host ip "{host_ip}" provided for port {host_port}')
        return cls(host_port, container_port, protocol.lower(), host_ip)


_MAPPING_FIELDS = GoFields("hostPort", "containerPort", "protocol", "hostIP")


def _invalid(msg: str) -> CNIError:
    return CNIError(msg, code=ErrorCode.INTERNAL)
