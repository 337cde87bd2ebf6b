"""Helpers for the plugin tests: a host namespace the test thread sits in, requests, probes.

Every test runs its plugins with the calling thread inside a throwaway "host" namespace and
with ``PYCNI_STATE_DIR`` and host-local's data dir under ``tmp_path``. The helpers are reached
through the ``kit`` fixture (test modules do not import conftest).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pycni import netns
from pycni.sdk import PluginRequest


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    path = str(tmp_path / "state")
    monkeypatch.setenv("PYCNI_STATE_DIR", path)
    return path


@pytest.fixture
def host(host_ns: netns.Throwaway) -> Iterator[netns.Throwaway]:
    """The test thread inside the throwaway host namespace for the whole test."""
    with netns.entered(host_ns.path):
        yield host_ns


def _request(
    command: str, config: dict[str, Any], cid: str, ns: str, ifname: str = "eth0", args: str = ""
) -> PluginRequest:
    return PluginRequest(command, config, cid, ns, ifname, args, ("/usr/lib/cni",))


def _bridge_conf(tmp_path: Any, *ranges: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "cniVersion": "1.0.0",
        "name": "testnet",
        "type": "bridge",
        "bridge": "pbr0",
        "isGateway": True,
        "isDefaultGateway": True,
        "ipMasq": True,
        "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam"), "ranges": list(ranges)},
    }
    conf.update(extra)
    return conf


def _nft_ruleset(path: str | None = None) -> dict[str, Any]:
    """``nft -j list ruleset`` of a namespace (``None``: the caller's)."""

    def body() -> dict[str, Any]:
        from pycni._libnftables import Nftables

        rc, out, err = Nftables().json_cmd({"nftables": [{"list": {"ruleset": None}}]})
        assert rc == 0, err
        return out

    return netns.run_in(path, body)


def _nft_elements(path: str | None = None) -> dict[str, list[Any]]:
    """Set/map name -> its elements (family-qualified for the bridge table)."""
    out: dict[str, list[Any]] = {}
    for obj in _nft_ruleset(path)["nftables"]:
        for kind in ("set", "map"):
            if kind in obj:
                body = obj[kind]
                name = body["name"] if body["family"] == "inet" else f"{body['family']}:{body['name']}"
                out[name] = body.get("elem", [])
    return out


def _nft_rule_count(path: str | None = None) -> int:
    return sum(1 for obj in _nft_ruleset(path)["nftables"] if "rule" in obj)


def _serve_tcp(path: str, addr: str, port: int, reply: bytes = b"pong") -> Callable[[], None]:
    """A TCP server in namespace ``path`` answering ``reply`` to every connection; returns stop()."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET

    def make() -> socket.socket:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, port))
        s.listen(16)
        s.settimeout(0.2)
        return s

    server = netns.run_in(path, make)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(reply)

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()

    def close() -> None:
        stop.set()
        worker.join()
        server.close()

    return close


def _tcp_get(path: str | None, addr: str, port: int, timeout: float = 3.0) -> bytes:
    """Connect from namespace ``path`` and return what the server sent."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET

    def body() -> bytes:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect((addr, port))
            return s.recv(64)

    return netns.run_in(path, body)


def _links_in(path: str | None = None) -> dict[str, Any]:
    """Link name -> :class:`pycni_plugins.kernel.links.Link` in a namespace."""
    from pycni_plugins.kernel import links

    def body() -> dict[str, Any]:
        with links.iproute() as ipr:
            return {link.name: link for link in links.dump_links(ipr)}

    return netns.run_in(path, body)


def _join_delete_helpers() -> None:
    """Wait for :func:`~pycni_plugins.kernel.links.delete_link`'s helper threads to end."""
    helpers = [t for t in threading.enumerate() if t.name.startswith("dellink:")]
    for helper in helpers:
        helper.join(10)
    assert not any(t.is_alive() for t in helpers)


def _sysctl_in(path: str | None, name: str) -> str:
    from pycni_plugins.kernel import sysctl

    return netns.run_in(path, sysctl.read, name)


class Kit:
    request = staticmethod(_request)
    bridge_conf = staticmethod(_bridge_conf)
    nft_ruleset = staticmethod(_nft_ruleset)
    nft_elements = staticmethod(_nft_elements)
    nft_rule_count = staticmethod(_nft_rule_count)
    serve_tcp = staticmethod(_serve_tcp)
    tcp_get = staticmethod(_tcp_get)
    links_in = staticmethod(_links_in)
    sysctl_in = staticmethod(_sysctl_in)
    join_delete_helpers = staticmethod(_join_delete_helpers)


@pytest.fixture
def kit() -> type[Kit]:
    return Kit
