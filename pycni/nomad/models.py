"""The slice of Nomad's allocation and node that the CNI configurator reads, as attrs models.

Input is what Nomad's HTTP API serialises (``/v1/allocation/:id``, ``/v1/node/:id``): PascalCase
keys, no json tags. Each model is declared: every attrs field names its Go field and Go type in
its metadata (:func:`_go`), and one function, :func:`_decode`, decodes any model from JSON as Go's
``encoding/json`` decodes into those structs, with :mod:`pycni._json`'s reader rules: keys match
exactly else case-insensitively (the last matching key wins), unknown keys are ignored, ``null``
leaves the zero value, numbers must fit the Go type (``int`` = int64, ``uint16``) and never be
fractional. A value of the wrong type is a :class:`~pycni.nomad.errors.DecodeError` naming the
field path, e.g. ``Job.TaskGroups[0].Networks[1].DynamicPorts[0].Value: expected an integer, got "x"``.

Where Go would panic (no ``Job``, no such task group) this is a ``DecodeError`` too; a missing
``AllocatedResources`` reads as empty.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from .. import _json
from .._json import GoValueError
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

A = TypeVar("A", bound=attrs.AttrsInstance)

UINT16 = (0, 2**16 - 1)


# -- the Go types, and the one decoder -----------------------------------------------------------

Decode = Callable[[Any], Any]
"""How one Go type is decoded from a JSON value; a wrong value raises :class:`GoValueError`."""

_GO = "pycni.go"


def _go(name: str, decode: Decode) -> dict[str, Any]:
    """The metadata of an attrs field decoded from the Go struct field ``name`` by ``decode``."""
    return {_GO: (name, decode)}


def _decode(cls: type[A], value: Any) -> A:
    """Decode a declared model (a Go struct) from a JSON object; ``null`` is the zero struct."""
    obj = _json.go_object(value)
    kwargs = {}
    for field in attrs.fields(cls):
        name, decode = field.metadata[_GO]
        try:
            kwargs[field.name] = decode(_json.go_field(obj, name))
        except GoValueError as e:
            raise e.at(name) from None
    return cls(**kwargs)


def _struct(cls: type[Any]) -> Decode:
    return lambda value: _decode(cls, value)


def _pointer(cls: type[Any]) -> Decode:
    """A Go pointer to a struct: ``None`` for null."""
    return lambda value: None if value is None else _decode(cls, value)


def _slice(item: Decode, *, pointers: bool = False, nil: bool = False) -> Decode:
    """A Go slice as a tuple (``nil``: null is ``None``, Go's nil slice, which Nomad serialises as
    null; else ``()``). A null element of a slice of pointers would be a nil Nomad dereferences,
    so it is refused; of values it is the zero value."""

    def decode(value: Any) -> tuple[Any, ...] | None:
        if value is None:
            return None if nil else ()
        out = []
        for i, element in enumerate(_json.go_array(value)):
            try:
                if element is None and pointers:
                    raise GoValueError(None, "an object")
                out.append(item(element))
            except GoValueError as e:
                raise e.at(i) from None
        return tuple(out)

    return decode


def _str_map(value: Any) -> dict[str, str]:
    """A Go ``map[string]string`` (keys exact, as a map's are)."""
    out = {}
    for key, item in _json.go_object(value).items():
        try:
            out[key] = _json.go_string(item)
        except GoValueError as e:
            raise e.at(f"[{json.dumps(key)}]") from None
    return out


STRING, INT, BOOL = _json.go_string, _json.go_int, _json.go_bool


def _uint16(value: Any) -> int:
    return _json.go_int(value, "uint16", UINT16)


class _Model:
    """What every declared model has: ``from_json``, the one decoder with Nomad's errors."""

    __slots__ = ()

    @classmethod
    def from_json(cls: type[A], data: Any) -> A:
        """Decode from Nomad's API JSON; a wrong value is a :class:`DecodeError` naming its path."""
        try:
            return _decode(cls, data)
        except GoValueError as e:
            raise DecodeError(e.where(), e.problem(literal=True)) from None


def load_json(data: bytes | str, what: str) -> Any:
    """Parse a JSON document; anything unparsable is a :class:`DecodeError` about ``what``."""
    try:
        return _json.loads(data)
    except _json.JSONDecodeFailure as e:
        raise DecodeError("", f"{what} is not valid JSON: {e}") from None


# -- job spec ------------------------------------------------------------------------------------


@attrs.frozen
class Port(_Model):
    """``structs.Port``: a jobspec or allocated network port (``To`` -1 means "same as host")."""

    label: str = attrs.field(default="", metadata=_go("Label", STRING))
    value: int = attrs.field(default=0, metadata=_go("Value", INT))
    to: int = attrs.field(default=0, metadata=_go("To", INT))
    host_network: str = attrs.field(default="", metadata=_go("HostNetwork", STRING))


@attrs.frozen
class CNIConfig(_Model):
    """``network.cni`` of the jobspec: extra CNI args."""

    args: Mapping[str, str] = attrs.field(factory=dict, metadata=_go("Args", _str_map))


@attrs.frozen
class NetworkResource(_Model):
    mode: str = attrs.field(default="", metadata=_go("Mode", STRING))
    reserved_ports: tuple[Port, ...] = attrs.field(default=(), metadata=_go("ReservedPorts", _slice(_struct(Port))))
    dynamic_ports: tuple[Port, ...] = attrs.field(default=(), metadata=_go("DynamicPorts", _slice(_struct(Port))))
    cni: CNIConfig | None = attrs.field(default=None, metadata=_go("CNI", _pointer(CNIConfig)))


_NETWORKS = _slice(_struct(NetworkResource), pointers=True)
_STRINGS = _slice(STRING, nil=True)


@attrs.frozen
class TransparentProxy(_Model):
    """``transparent_proxy`` block. ``None`` lists were nil in Go (and serialise as null)."""

    uid: str = attrs.field(default="", metadata=_go("UID", STRING))
    outbound_port: int = attrs.field(default=0, metadata=_go("OutboundPort", _uint16))
    exclude_inbound_ports: tuple[str, ...] | None = attrs.field(
        default=None, metadata=_go("ExcludeInboundPorts", _STRINGS)
    )
    exclude_outbound_ports: tuple[int, ...] | None = attrs.field(
        default=None, metadata=_go("ExcludeOutboundPorts", _slice(_uint16, nil=True))
    )
    exclude_outbound_cidrs: tuple[str, ...] | None = attrs.field(
        default=None, metadata=_go("ExcludeOutboundCIDRs", _STRINGS)
    )
    exclude_uids: tuple[str, ...] | None = attrs.field(default=None, metadata=_go("ExcludeUIDs", _STRINGS))
    no_dns: bool = attrs.field(default=False, metadata=_go("NoDNS", BOOL))


@attrs.frozen
class ExposePath(_Model):
    path: str = attrs.field(default="", metadata=_go("Path", STRING))
    protocol: str = attrs.field(default="", metadata=_go("Protocol", STRING))
    local_path_port: int = attrs.field(default=0, metadata=_go("LocalPathPort", INT))
    listener_port: str = attrs.field(default="", metadata=_go("ListenerPort", STRING))


@attrs.frozen
class Expose(_Model):
    paths: tuple[ExposePath, ...] = attrs.field(default=(), metadata=_go("Paths", _slice(_struct(ExposePath))))


@attrs.frozen
class Proxy(_Model):
    transparent_proxy: TransparentProxy | None = attrs.field(
        default=None, metadata=_go("TransparentProxy", _pointer(TransparentProxy))
    )
    expose: Expose | None = attrs.field(default=None, metadata=_go("Expose", _pointer(Expose)))


@attrs.frozen
class SidecarService(_Model):
    proxy: Proxy | None = attrs.field(default=None, metadata=_go("Proxy", _pointer(Proxy)))


@attrs.frozen
class Connect(_Model):
    sidecar_service: SidecarService | None = attrs.field(
        default=None, metadata=_go("SidecarService", _pointer(SidecarService))
    )

    @property
    def proxy(self) -> Proxy | None:
        sidecar = self.sidecar_service
        return sidecar.proxy if sidecar is not None else None


@attrs.frozen
class Service(_Model):
    name: str = attrs.field(default="", metadata=_go("Name", STRING))
    cluster: str = attrs.field(default="", metadata=_go("Cluster", STRING))
    connect: Connect | None = attrs.field(default=None, metadata=_go("Connect", _pointer(Connect)))

    @property
    def proxy(self) -> Proxy | None:
        return self.connect.proxy if self.connect is not None else None

    @property
    def transparent_proxy(self) -> TransparentProxy | None:
        """Set exactly when Nomad's ``Connect.HasTransparentProxy()`` holds."""
        proxy = self.proxy
        return proxy.transparent_proxy if proxy is not None else None


@attrs.frozen
class TaskGroup(_Model):
    name: str = attrs.field(default="", metadata=_go("Name", STRING))
    networks: tuple[NetworkResource, ...] = attrs.field(default=(), metadata=_go("Networks", _NETWORKS))
    services: tuple[Service, ...] = attrs.field(
        default=(), metadata=_go("Services", _slice(_struct(Service), pointers=True))
    )

    @property
    def has_transparent_proxy(self) -> bool:
        """Whether any service uses transparent proxy (then the bridge conflist gets consul-cni)."""
        return any(svc.transparent_proxy is not None for svc in self.services)


@attrs.frozen
class Job(_Model):
    id: str = attrs.field(default="", metadata=_go("ID", STRING))
    region: str = attrs.field(default="", metadata=_go("Region", STRING))
    task_groups: tuple[TaskGroup, ...] = attrs.field(
        default=(), metadata=_go("TaskGroups", _slice(_struct(TaskGroup), pointers=True))
    )


# -- allocation ----------------------------------------------------------------------------------


@attrs.frozen
class AllocatedPortMapping(_Model):
    """``structs.AllocatedPortMapping``: a port the scheduler assigned (``HostIP`` is the host address)."""

    label: str = attrs.field(default="", metadata=_go("Label", STRING))
    value: int = attrs.field(default=0, metadata=_go("Value", INT))
    to: int = attrs.field(default=0, metadata=_go("To", INT))
    host_ip: str = attrs.field(default="", metadata=_go("HostIP", STRING))


@attrs.frozen
class SharedResources(_Model):
    """``AllocatedResources.Shared``: ``ports`` (current) and ``networks`` (the legacy form)."""

    ports: tuple[AllocatedPortMapping, ...] = attrs.field(
        default=(), metadata=_go("Ports", _slice(_struct(AllocatedPortMapping)))
    )
    networks: tuple[NetworkResource, ...] = attrs.field(default=(), metadata=_go("Networks", _NETWORKS))


@attrs.frozen
class _AllocatedResources:
    shared: SharedResources = attrs.field(default=SharedResources(), metadata=_go("Shared", _struct(SharedResources)))


def _shared(value: Any) -> SharedResources:
    """``AllocatedResources``, of which only ``Shared`` is read."""
    return _decode(_AllocatedResources, value).shared


@attrs.frozen
class Allocation(_Model):
    id: str = attrs.field(metadata=_go("ID", STRING))
    namespace: str = attrs.field(metadata=_go("Namespace", STRING))
    task_group: str = attrs.field(metadata=_go("TaskGroup", STRING))
    job: Job = attrs.field(metadata=_go("Job", _pointer(Job)))
    shared: SharedResources = attrs.field(default=SharedResources(), metadata=_go("AllocatedResources", _shared))

    @classmethod
    def from_json(cls, data: Any) -> Allocation:
        alloc = super().from_json(data)
        if alloc.job is None:  # where Nomad would panic
            raise DecodeError("Job", "missing: the allocation must embed its job")
        _lookup_group(alloc.job, alloc.task_group)  # fail at decode time, not in the middle of a setup
        return alloc

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
class Node(_Model):
    """The node's fingerprinted ``Attributes`` and client ``Meta`` (both string maps)."""

    attributes: Mapping[str, str] = attrs.field(factory=dict, metadata=_go("Attributes", _str_map))
    meta: Mapping[str, str] = attrs.field(factory=dict, metadata=_go("Meta", _str_map))

    @classmethod
    def loads(cls, data: bytes | str) -> Node:
        return cls.from_json(load_json(data, "node"))
