"""The ``portMappings`` capability Nomad passes to the portmap plugin (``getPortMapping``).

Every allocated port becomes two mappings, tcp then udp, in allocation order. ``To < 1`` means
"same as the host port". The current form (``AllocatedResources.Shared.Ports``) carries the host
IP unless ``ignore_host_ip``; the legacy form (only ``Shared.Networks``) lists each network's
dynamic ports before its reserved ones and never sets a host IP. A label lookup returns the last
mapping recorded for it, i.e. the udp one (both protocols share the port numbers).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from ..types import PortMapping
from .models import Allocation

__all__ = ["PortMapping", "PortMappings", "port_mappings"]

PROTOCOLS = ("tcp", "udp")


def _int32(value: int) -> int:
    # Nomad converts the Go int to the int32 of cni.PortMapping, wrapping like any Go conversion.
    return (value + 2**31) % 2**32 - 2**31


@attrs.frozen
class PortMappings:
    """What Nomad's ``getPortMapping`` returns: the mappings in order, and ``labels``: label →
    index of its last mapping; ``port_labels`` is each mapping's label (for ``pycni nomad ports``)."""

    ports: tuple[PortMapping, ...] = ()
    labels: Mapping[str, int] = attrs.field(factory=dict)
    port_labels: tuple[str, ...] = ()

    def get(self, label: str) -> PortMapping | None:
        index = self.labels.get(label)
        return None if index is None else self.ports[index]

    def capability(self) -> list[dict[str, Any]]:
        return [p.to_json() for p in self.ports]

    def to_json(self) -> list[dict[str, Any]]:
        """Each mapping's capability entry after its ``label``."""
        return [{"label": label, **p.to_json()} for label, p in zip(self.port_labels, self.ports)]

    def __iter__(self) -> Iterator[PortMapping]:
        return iter(self.ports)

    def __len__(self) -> int:
        return len(self.ports)


def port_mappings(alloc: Allocation, ignore_host_ip: bool) -> PortMappings:
    shared = alloc.shared
    found: list[tuple[str, int, int, str]] = []  # (label, value, to, host ip)
    if not shared.ports and shared.networks:
        for network in shared.networks:
            for port in network.dynamic_ports + network.reserved_ports:
                found.append((port.label, port.value, port.to, ""))
    else:
        for mapped in shared.ports:
            found.append((mapped.label, mapped.value, mapped.to, "" if ignore_host_ip else mapped.host_ip))

    ports: list[PortMapping] = []
    port_labels: list[str] = []
    labels: dict[str, int] = {}
    for label, value, to, host_ip in found:
        container = value if to < 1 else to
        for proto in PROTOCOLS:
            ports.append(PortMapping(_int32(value), _int32(container), proto, host_ip))
            port_labels.append(label)
            labels[label] = len(ports) - 1
    return PortMappings(tuple(ports), labels, tuple(port_labels))
