"""A go-cni style client: load networks once, then set up / check / remove a container on all.

    cni = CNI(plugin_dirs=["/usr/lib/cni"], conf_dir="/etc/cni/net.d")
    cni.load(with_lo_network, with_default_conf)
    result = cni.setup("ctr1", "/run/netns/ctr1", with_capability_port_map([...]), with_labels({...}))

Options, errors and :class:`~pycni.gocni_result.GoCNIResult` follow go-cni v1.1 (networks are
attached in parallel by :meth:`CNI.setup`, serially by :meth:`CNI.setup_serially`; the default
interface ``<prefix>0`` is always in the result; :meth:`CNI.remove` tolerates "not found").
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from . import config as _config
from .cache import DEFAULT_CACHE_DIR
from .errors import CNIError, ConfigError
from .gocni_result import GoCNIResult
from .runtime import DEFAULT_PLUGIN_PATH, Runtime
from .runtime_conf import RuntimeConf
from .types import PortMapping  # go-cni's cni.PortMapping: the one capability entry

__all__ = [
    "CNI",
    "Network",
    "ConfigResult",
    "PortMapping",
    "NotInitializedError",
    "InvalidConfigError",
    "NotFoundError",
    "ReadError",
    "InvalidResultError",
    "LoadError",
    "with_lo_network",
    "with_conf",
    "with_conf_index",
    "with_conf_file",
    "with_conf_list_bytes",
    "with_conf_list_file",
    "with_default_conf",
    "with_all_conf",
    "with_capability_port_map",
    "with_capability_ip_ranges",
    "with_capability_bandwidth",
    "with_capability_dns",
    "with_capability_cgroup_path",
    "with_capability",
    "with_labels",
    "with_args",
]

DEFAULT_PREFIX = "eth"
LOOPBACK_CONFLIST = b'{"cniVersion":"0.3.1","name":"cni-loopback","plugins":[{"type":"loopback"}]}'


class NotInitializedError(CNIError):
    """Fewer networks are loaded than the minimum network count (``cni plugin not initialized``)."""


class InvalidConfigError(ConfigError):
    """A config file in the conf dir is not a usable network (``invalid cni config``)."""


class NotFoundError(CNIError):
    """``not found``."""


class ReadError(ConfigError):
    """The conf dir could not be read (``failed to read config file``)."""


class InvalidResultError(CNIError):
    """A plugin result go-cni cannot map to interfaces (``invalid result``)."""


class LoadError(CNIError):
    """``load()`` failed (``failed to load cni config``); ``__cause__`` has the reason."""


@attrs.frozen
class Network:
    """A loaded network list and the interface name it attaches as."""

    config: _config.NetworkConfigList
    ifname: str


@attrs.frozen
class ConfigResult:
    plugin_dirs: tuple[str, ...]
    plugin_conf_dir: str
    plugin_max_conf_num: int
    prefix: str
    networks: tuple[Network, ...]


@attrs.define
class _Namespace:
    capability_args: dict[str, Any] = attrs.Factory(dict)
    args: dict[str, str] = attrs.Factory(dict)


Opt = Callable[["CNI"], None]
NamespaceOpt = Callable[[_Namespace], None]


class CNI:
    """go-cni's ``CNI``; safe to share between threads.

    Beyond go-cni: ``cache_dir``, ``state_dir``, ``backend`` (exec/inprocess/auto), ``timeout``
    and ``host_netns`` are passed to the underlying :class:`~pycni.runtime.Runtime`.
    """

    def __init__(
        self,
        *,
        plugin_dirs: Sequence[str] = DEFAULT_PLUGIN_PATH,
        conf_dir: str = _config.DEFAULT_CONF_DIR,
        interface_prefix: str = DEFAULT_PREFIX,
        min_network_count: int = 1,
        plugin_max_conf_num: int = 1,
        cache_dir: str = DEFAULT_CACHE_DIR,
        state_dir: str | None = None,
        backend: Any = None,
        timeout: float | None = None,
        host_netns: str | None = None,
    ) -> None:
        self.plugin_dirs = tuple(plugin_dirs)
        self.conf_dir = conf_dir
        self.prefix = interface_prefix
        self.min_network_count = min_network_count
        self.plugin_max_conf_num = plugin_max_conf_num
        self.runtime = Runtime(
            self.plugin_dirs,
            cache_dir=cache_dir,
            state_dir=state_dir,
            backend=backend,
            timeout=timeout,
            host_netns=host_netns,
        )
        self._networks: list[Network] = []
        self._lock = threading.RLock()

    # -- loading -------------------------------------------------------------------------

    def _append(self, conflist: _config.NetworkConfigList, ifname: str) -> None:
        self._networks.append(Network(conflist, ifname))

    def load(self, *opts: Opt) -> None:
        """Replace the loaded networks with those the options add."""
        with self._lock:
            self._networks = []
            for opt in opts:
                try:
                    opt(self)
                except CNIError as e:
                    raise LoadError(f"cni config load failed: {e}: failed to load cni config") from e

    def networks(self) -> list[Network]:
        with self._lock:
            return list(self._networks)

    def get_config(self) -> ConfigResult:
        with self._lock:
            return ConfigResult(
                plugin_dirs=self.plugin_dirs,
                plugin_conf_dir=self.conf_dir,
                plugin_max_conf_num=self.plugin_max_conf_num,
                prefix=self.prefix,
                networks=tuple(self._networks),
            )

    def _ready(self) -> list[Network]:
        """A snapshot of the networks. Operations run on it without holding the lock, so
        concurrent setups proceed in parallel while ``load()`` swaps the list atomically."""
        with self._lock:
            if len(self._networks) < self.min_network_count:
                raise NotInitializedError("cni plugin not initialized")
            return list(self._networks)

    # -- operations ----------------------------------------------------------------------

    def _runtime_conf(self, network: Network, container_id: str, path: str, ns: _Namespace) -> RuntimeConf:
        return RuntimeConf(
            container_id=container_id,
            netns=path,
            ifname=network.ifname,
            args=tuple(ns.args.items()),
            capability_args=dict(ns.capability_args),
        )

    @staticmethod
    def _namespace(ns_opts: Iterable[NamespaceOpt]) -> _Namespace:
        ns = _Namespace()
        for opt in ns_opts:
            opt(ns)
        return ns

    def setup(self, container_id: str, path: str, *ns_opts: NamespaceOpt) -> GoCNIResult:
        """Attach every network concurrently; the first failure to arrive is raised."""
        networks = self._ready()
        ns = self._namespace(ns_opts)
        if len(networks) == 1:
            return self._result(
                [
                    self.runtime.add_network_list(
                        networks[0].config, self._runtime_conf(networks[0], container_id, path, ns)
                    )
                ]
            )
        results: list[Any] = [None] * len(networks)
        first_error: BaseException | None = None
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(networks)) as pool:
            futures = {
                pool.submit(self.runtime.add_network_list, n.config, self._runtime_conf(n, container_id, path, ns)): i
                for i, n in enumerate(networks)
            }
            for fut in concurrent.futures.as_completed(futures):
                error = fut.exception()
                if error is None:
                    results[futures[fut]] = fut.result()
                elif first_error is None:
                    first_error = error
        if first_error is not None:
            raise first_error
        return self._result(results)

    def setup_serially(self, container_id: str, path: str, *ns_opts: NamespaceOpt) -> GoCNIResult:
        """Attach the networks one at a time, stopping at the first failure."""
        ns = self._namespace(ns_opts)
        results = [
            self.runtime.add_network_list(n.config, self._runtime_conf(n, container_id, path, ns))
            for n in self._ready()
        ]
        return self._result(results)

    def _result(self, results: Sequence[Any]) -> GoCNIResult:
        try:
            return GoCNIResult.from_results(results, default_ifname=f"{self.prefix}0")
        except CNIError as e:
            raise InvalidResultError(f"{e.msg}: invalid result") from e

    def remove(self, container_id: str, path: str, *ns_opts: NamespaceOpt) -> None:
        """DEL every network in order; "not found" (and a gone netns with no path) is tolerated."""
        ns = self._namespace(ns_opts)
        for network in self._ready():
            try:
                self.runtime.delete_network_list(network.config, self._runtime_conf(network, container_id, path, ns))
            except CNIError as e:
                text = str(e)
                if (path == "" and "no such file or directory" in text) or "not found" in text:
                    continue
                raise

    def check(self, container_id: str, path: str, *ns_opts: NamespaceOpt) -> None:
        ns = self._namespace(ns_opts)
        for network in self._ready():
            self.runtime.check_network_list(network.config, self._runtime_conf(network, container_id, path, ns))

    def status(self) -> None:
        """Ready when enough networks are loaded and every plugin answers STATUS (≥ 1.1.0)."""
        for network in self._ready():
            self.runtime.get_status_network_list(network.config)


# -- network options ---------------------------------------------------------------------------


def with_lo_network(cni: CNI) -> None:
    """The built-in loopback network, attached as ``lo``."""
    cni._append(_config.conflist_from_bytes(LOOPBACK_CONFLIST), "lo")


def with_conf_index(data: bytes, index: int) -> Opt:
    def opt(cni: CNI) -> None:
        cni._append(_config.conflist_from_conf(_config.conf_from_bytes(data)), f"{cni.prefix}{index}")

    return opt


def with_conf(data: bytes) -> Opt:
    return with_conf_index(data, 0)


def with_conf_file(path: str) -> Opt:
    def opt(cni: CNI) -> None:
        cni._append(_config.conflist_from_conf(_config.conf_from_file(path)), f"{cni.prefix}0")

    return opt


def with_conf_list_bytes(data: bytes) -> Opt:
    def opt(cni: CNI) -> None:
        cni._append(_config.conflist_from_bytes(data), f"{cni.prefix}{len(cni._networks)}")

    return opt


def with_conf_list_file(path: str) -> Opt:
    def opt(cni: CNI) -> None:
        cni._append(_config.conflist_from_file(path), f"{cni.prefix}{len(cni._networks)}")

    return opt


def _load_from_conf_dir(cni: CNI, max_conf: int) -> None:
    try:
        files = _config.conf_files(cni.conf_dir, (".conf", ".conflist", ".json"))
    except ConfigError as e:
        raise ReadError(f"failed to read config file: {e}") from e
    if not files:
        raise NotInitializedError(f"no network config found in {cni.conf_dir}: cni plugin not initialized")
    loaded: list[Network] = []
    for i, path in enumerate(sorted(files)):
        if max_conf and i == max_conf:
            break
        try:
            if path.endswith(".conflist"):
                conflist = _config.conflist_from_file(path)
            else:
                conflist = _config.conflist_from_conf(_config.conf_from_file(path))
        except ConfigError as e:
            raise InvalidConfigError(f"failed to load CNI config file {path}: {e.msg}", path=path) from e
        loaded.append(Network(conflist, f"{cni.prefix}{i}"))
    if not loaded:
        raise NotInitializedError(f"no valid networks found in {list(cni.plugin_dirs)}: cni plugin not initialized")
    cni._networks.extend(loaded)


def with_default_conf(cni: CNI) -> None:
    """The first ``plugin_max_conf_num`` config files of the conf dir (go-cni ``WithDefaultConf``)."""
    _load_from_conf_dir(cni, cni.plugin_max_conf_num)


def with_all_conf(cni: CNI) -> None:
    _load_from_conf_dir(cni, 0)


# -- namespace options -------------------------------------------------------------------------


def with_capability(name: str, value: Any) -> NamespaceOpt:
    def opt(ns: _Namespace) -> None:
        ns.capability_args[name] = value

    return opt


def _jsonable(items: Iterable[Any]) -> list[Any]:
    return [i.to_json() if hasattr(i, "to_json") else dict(i) for i in items]


def with_capability_port_map(port_mappings: Iterable[PortMapping | Mapping[str, Any]]) -> NamespaceOpt:
    return with_capability("portMappings", _jsonable(port_mappings))


def with_capability_ip_ranges(ranges: Iterable[Iterable[Mapping[str, Any]]]) -> NamespaceOpt:
    return with_capability("ipRanges", [[dict(r) for r in rs] for rs in ranges])


def with_capability_bandwidth(bandwidth: Mapping[str, Any]) -> NamespaceOpt:
    return with_capability("bandwidth", dict(bandwidth))


def with_capability_dns(dns: Mapping[str, Any]) -> NamespaceOpt:
    return with_capability("dns", dict(dns))


def with_capability_cgroup_path(path: str) -> NamespaceOpt:
    return with_capability("cgroupPath", path)


def with_labels(labels: Mapping[str, str]) -> NamespaceOpt:
    def opt(ns: _Namespace) -> None:
        ns.args.update(labels)

    return opt


def with_args(key: str, value: str) -> NamespaceOpt:
    def opt(ns: _Namespace) -> None:
        ns.args[key] = value

    return opt
