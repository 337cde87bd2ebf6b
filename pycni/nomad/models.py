"""The slice of Nomad's allocation and node that the CNI configurator reads, as attrs models.

Input is what Nomad's HTTP API serialises (``/v1/allocation/:id``, ``/v1/node/:id``): PascalCase
keys, no json tags. Decoding follows Go's ``encoding/json`` into those structs: keys match
case-insensitively (the last matching key wins), unknown keys are ignored, ``null`` leaves the
zero value, numbers must fit the Go type (``int`` = int64, ``uint16``) and never be fractional.
A value of the wrong type is a :class:`~pycni.nomad.errors.DecodeError` naming the field path,
e.g. ``Job.TaskGroups[0].Networks[1].DynamicPorts[0].Value: expected an integer, got "x"``.

Where Go would panic (no ``Job``, no such task group) this is a ``DecodeError`` too; a missing
``AllocatedResources`` reads as empty.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from .. import _json
from .errors import DecodeError

__all__ = [
    "Port",
    "CNIConfig",
    "NetworkResource",
    "TransparentProxy",
    "ExposePath",
    "Expose",
    "Proxy",
    "SidecarService",
    "Connect",
    "Service",
    "TaskGroup",
    "Job",
    "AllocatedPortMapping",
    "SharedResources",
    "Allocation",
    "Node",
    "load_json",
]

T = TypeVar("T")

INT64 = (-(2**63), 2**63 - 1)
UINT16 = (0, 2**16 - 1)
_SURROGATE = re.compile("[\ud800-\udfff]")


# -- decoding helpers ----------------------------------------------------------------------------


def load_json(data: bytes | str, what: str) -> Any:
    """Parse a JSON document; anything unparsable is a :class:`DecodeError` about ``what``."""
    try:
        return _json.loads(data)
    except _json.JSONDecodeFailure as e:
        raise DecodeError("", f"{what} is not valid JSON: {e}") from None


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 128 else "a too large number"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        text = json.dumps(value[:40])
        return text if len(value) <= 40 else text[:-1] + '..."'
    return "an array" if isinstance(value, list) else "an object"


def _object(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DecodeError(path, f"expected an object, got {_show(value)}")
    return value


def _str(value: Any, path: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DecodeError(path, f"expected a string, got {_show(value)}")
    # Go decodes a lone UTF-16 surrogate escape as U+FFFD.
    return _SURROGATE.sub("\ufffd", value)


def _int(value: Any, path: str, bounds: tuple[int, int] = INT64) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise DecodeError(path, f"expected an integer, got {_show(value)}")
    lo, hi = bounds
    if not lo <= value <= hi:
        raise DecodeError(path, f"integer {_show(value)} out of range [{lo}, {hi}]")
    return value


def _bool(value: Any, path: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise DecodeError(path, f"expected a boolean, got {_show(value)}")
    return value


def _list(value: Any, path: str, item: Callable[[Any, str], T], *, pointers: bool = False) -> tuple[T, ...] | None:
    """A JSON array (``None`` for null/absent, as Go's nil slice). A null element of a slice of
    pointers would be a nil Nomad dereferences, so it is refused; of values it is the zero value."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise DecodeError(path, f"expected an array, got {_show(value)}")
    out = []
    for i, element in enumerate(value):
        where = f"{path}[{i}]"
        if element is None and pointers:
            raise DecodeError(where, "expected an object, got null")
        out.append(item(element, where))
    return tuple(out)


def _str_map(value: Any, path: str) -> dict[str, str]:
    obj = _object(value, path)
    return {_str(k, path): _str(v, f"{path}[{json.dumps(k)}]") for k, v in obj.items()}


def _get(obj: Mapping[str, Any], path: str, name: str, conv: Callable[[Any, str], T]) -> T:
    return conv(_json.go_field(obj, name), f"{path}.{name}" if path else name)


def _seq(items: tuple[T, ...] | None) -> tuple[T, ...]:
    return items or ()


# -- job spec ------------------------------------------------------------------------------------


@attrs.frozen
class Port:
    """``structs.Port``: a jobspec or allocated network port (``To`` -1 means "same as host")."""

    label: str = ""
    value: int = 0
    to: int = 0
    host_network: str = ""

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> Port:
        obj = _object(data, path)
        return cls(
            label=_get(obj, path, "Label", _str),
            value=_get(obj, path, "Value", _int),
            to=_get(obj, path, "To", _int),
            host_network=_get(obj, path, "HostNetwork", _str),
        )


@attrs.frozen
class CNIConfig:
    """``network.cni`` of the jobspec: extra CNI args."""

    args: Mapping[str, str] = attrs.field(factory=dict)

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> CNIConfig | None:
        if data is None:
            return None
        obj = _object(data, path)
        return cls(args=_get(obj, path, "Args", _str_map))


@attrs.frozen
class NetworkResource:
    mode: str = ""
    reserved_ports: tuple[Port, ...] = ()
    dynamic_ports: tuple[Port, ...] = ()
    cni: CNIConfig | None = None

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> NetworkResource:
        obj = _object(data, path)
        return cls(
            mode=_get(obj, path, "Mode", _str),
            reserved_ports=_seq(_get(obj, path, "ReservedPorts", lambda v, p: _list(v, p, Port.from_json))),
            dynamic_ports=_seq(_get(obj, path, "DynamicPorts", lambda v, p: _list(v, p, Port.from_json))),
            cni=_get(obj, path, "CNI", CNIConfig.from_json),
        )


def _networks(value: Any, path: str) -> tuple[NetworkResource, ...]:
    return _seq(_list(value, path, NetworkResource.from_json, pointers=True))


def _strs(value: Any, path: str) -> tuple[str, ...] | None:
    return _list(value, path, _str)


@attrs.frozen
class TransparentProxy:
    """``transparent_proxy`` block. ``None`` lists were nil in Go (and serialise as null)."""

    uid: str = ""
    outbound_port: int = 0
    exclude_inbound_ports: tuple[str, ...] | None = None
    exclude_outbound_ports: tuple[int, ...] | None = None
    exclude_outbound_cidrs: tuple[str, ...] | None = None
    exclude_uids: tuple[str, ...] | None = None
    no_dns: bool = False

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> TransparentProxy | None:
        if data is None:
            return None
        obj = _object(data, path)
        return cls(
            uid=_get(obj, path, "UID", _str),
            outbound_port=_get(obj, path, "OutboundPort", lambda v, p: _int(v, p, UINT16)),
            exclude_inbound_ports=_get(obj, path, "ExcludeInboundPorts", _strs),
            exclude_outbound_ports=_get(
                obj, path, "ExcludeOutboundPorts", lambda v, p: _list(v, p, lambda e, q: _int(e, q, UINT16))
            ),
            exclude_outbound_cidrs=_get(obj, path, "ExcludeOutboundCIDRs", _strs),
            exclude_uids=_get(obj, path, "ExcludeUIDs", _strs),
            no_dns=_get(obj, path, "NoDNS", _bool),
        )


@attrs.frozen
class ExposePath:
    path: str = ""
    protocol: str = ""
    local_path_port: int = 0
    listener_port: str = ""

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> ExposePath:
        obj = _object(data, path)
        return cls(
            path=_get(obj, path, "Path", _str),
            protocol=_get(obj, path, "Protocol", _str),
            local_path_port=_get(obj, path, "LocalPathPort", _int),
            listener_port=_get(obj, path, "ListenerPort", _str),
        )


@attrs.frozen
class Expose:
    paths: tuple[ExposePath, ...] = ()

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> Expose | None:
        if data is None:
            return None
        obj = _object(data, path)
        return cls(paths=_seq(_get(obj, path, "Paths", lambda v, p: _list(v, p, ExposePath.from_json))))


@attrs.frozen
class Proxy:
    transparent_proxy: TransparentProxy | None = None
    expose: Expose | None = None

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> Proxy | None:
        if data is None:
            return None
        obj = _object(data, path)
        return cls(
            transparent_proxy=_get(obj, path, "TransparentProxy", TransparentProxy.from_json),
            expose=_get(obj, path, "Expose", Expose.from_json),
        )


@attrs.frozen
class SidecarService:
    proxy: Proxy | None = None

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> SidecarService | None:
        if data is None:
            return None
        return cls(proxy=_get(_object(data, path), path, "Proxy", Proxy.from_json))


@attrs.frozen
class Connect:
    sidecar_service: SidecarService | None = None

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> Connect | None:
        if data is None:
            return None
        return cls(sidecar_service=_get(_object(data, path), path, "SidecarService", SidecarService.from_json))

    @property
    def proxy(self) -> Proxy | None:
        sidecar = self.sidecar_service
        return sidecar.proxy if sidecar is not None else None


@attrs.frozen
class Service:
    name: str = ""
    cluster: str = ""
    connect: Connect | None = None

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> Service:
        obj = _object(data, path)
        return cls(
            name=_get(obj, path, "Name", _str),
            cluster=_get(obj, path, "Cluster", _str),
            connect=_get(obj, path, "Connect", Connect.from_json),
        )

    @property
    def proxy(self) -> Proxy | None:
        return self.connect.proxy if self.connect is not None else None

    @property
    def transparent_proxy(self) -> TransparentProxy | None:
        """Set exactly when Nomad's ``Connect.HasTransparentProxy()`` holds."""
        proxy = self.proxy
        return proxy.transparent_proxy if proxy is not None else None


@attrs.frozen
class TaskGroup:
    name: str = ""
    networks: tuple[NetworkResource, ...] = ()
    services: tuple[Service, ...] = ()

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> TaskGroup:
        obj = _object(data, path)
        return cls(
            name=_get(obj, path, "Name", _str),
            networks=_get(obj, path, "Networks", _networks),
            services=_seq(_get(obj, path, "Services", lambda v, p: _list(v, p, Service.from_json, pointers=True))),
        )

    @property
    def has_transparent_proxy(self) -> bool:
        """Whether any service uses transparent proxy (then the bridge conflist gets consul-cni)."""
        return any(svc.transparent_proxy is not None for svc in self.services)


@attrs.frozen
class Job:
    id: str = ""
    region: str = ""
    task_groups: tuple[TaskGroup, ...] = ()

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> Job | None:
        if data is None:
            return None
        obj = _object(data, path)
        return cls(
            id=_get(obj, path, "ID", _str),
            region=_get(obj, path, "Region", _str),
            task_groups=_seq(
                _get(obj, path, "TaskGroups", lambda v, p: _list(v, p, TaskGroup.from_json, pointers=True))
            ),
        )


# -- allocation ----------------------------------------------------------------------------------


@attrs.frozen
class AllocatedPortMapping:
    """``structs.AllocatedPortMapping``: a port the scheduler assigned (``HostIP`` is the host address)."""

    label: str = ""
    value: int = 0
    to: int = 0
    host_ip: str = ""

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> AllocatedPortMapping:
        obj = _object(data, path)
        return cls(
            label=_get(obj, path, "Label", _str),
            value=_get(obj, path, "Value", _int),
            to=_get(obj, path, "To", _int),
            host_ip=_get(obj, path, "HostIP", _str),
        )


@attrs.frozen
class SharedResources:
    """``AllocatedResources.Shared``: ``ports`` (current) and ``networks`` (the legacy form)."""

    ports: tuple[AllocatedPortMapping, ...] = ()
    networks: tuple[NetworkResource, ...] = ()

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> SharedResources:
        obj = _object(data, path)
        return cls(
            ports=_seq(_get(obj, path, "Ports", lambda v, p: _list(v, p, AllocatedPortMapping.from_json))),
            networks=_get(obj, path, "Networks", _networks),
        )


def _shared(value: Any, path: str) -> SharedResources:
    return _get(_object(value, path), path, "Shared", SharedResources.from_json)


@attrs.frozen
class Allocation:
    id: str
    namespace: str
    task_group: str
    job: Job
    shared: SharedResources = SharedResources()

    @classmethod
    def from_json(cls, data: Any) -> Allocation:
        obj = _object(data, "")
        job = _get(obj, "", "Job", Job.from_json)
        if job is None:
            raise DecodeError("Job", "missing: the allocation must embed its job")
        task_group = _get(obj, "", "TaskGroup", _str)
        _lookup_group(job, task_group)  # fail at decode time, not in the middle of a setup
        return cls(
            id=_get(obj, "", "ID", _str),
            namespace=_get(obj, "", "Namespace", _str),
            task_group=task_group,
            job=job,
            shared=_get(obj, "", "AllocatedResources", _shared),
        )

    @classmethod
    def loads(cls, data: bytes | str) -> Allocation:
        return cls.from_json(load_json(data, "allocation"))

    @property
    def group(self) -> TaskGroup:
        """The allocation's task group (Nomad's ``Job.LookupTaskGroup(TaskGroup)``)."""
        return _lookup_group(self.job, self.task_group)


def _lookup_group(job: Job, name: str) -> TaskGroup:
    for tg in job.task_groups:
        if tg.name == name:
            return tg
    raise DecodeError("TaskGroup", f"no task group {json.dumps(name)} in Job.TaskGroups")


@attrs.frozen
class Node:
    """The node's fingerprinted ``Attributes`` and client ``Meta`` (both string maps)."""

    attributes: Mapping[str, str] = attrs.field(factory=dict)
    meta: Mapping[str, str] = attrs.field(factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> Node:
        obj = _object(data, "")
        return cls(attributes=_get(obj, "", "Attributes", _str_map), meta=_get(obj, "", "Meta", _str_map))

    @classmethod
    def loads(cls, data: bytes | str) -> Node:
        return cls.from_json(load_json(data, "node"))
