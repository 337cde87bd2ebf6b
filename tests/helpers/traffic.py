"""Traffic probes for the transparent-proxy tests: labelled listeners that report where a
connection was originally headed (``SO_ORIGINAL_DST``), clients running as another UID, veths.

A client of another UID runs as a subprocess (``subprocess.run(user=...)``) started from a
thread that entered the namespace, so it inherits that namespace; the test process itself never
changes its UID (glibc's setuid would change every thread's).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from pycni import netns

__all__ = ["Listener", "listening", "tcp_as", "udp_query", "veth"]

SO_ORIGINAL_DST = 80
PYTHON = "/usr/bin/python3"

_CLIENT = """
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
    s.settimeout(3)
    print(s.recv(200).decode(), end="")
except OSError as e:
    print(f"error: {e.__class__.__name__}", end="")
"""


def _original_dst(conn: socket.socket) -> str:
    """Where the client was headed if this host's NAT changed it, else ``-``."""
    try:
        raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    except OSError:  # no conntrack entry here: nothing NAT'ed it in this namespace
        return "-"
    port, addr = struct.unpack("!2xH4s8x", raw)
    original = (socket.inet_ntoa(addr), port)
    return "-" if original == conn.getsockname()[:2] else f"{original[0]}:{original[1]}"


class Listener:
    """Answers every TCP connection with ``"<label> <original destination>"`` (UDP: ``<label>``).

    The original destination is the one before this namespace's NAT (``SO_ORIGINAL_DST``), or
    ``-`` when nothing here rewrote it: a reply says who answered and where the client was going.
    """

    def __init__(self, netns_path: str | None, host: str, port: int, label: str, *, udp: bool = False) -> None:
        self.label = label
        self.udp = udp
        self.peers: list[str] = []
        self._sock = netns.run_in(netns_path, self._bind, host, port)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_udp if udp else self._serve_tcp, daemon=True)
        self._thread.start()

    def _bind(self, host: str, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if self.udp else socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        if not self.udp:
            sock.listen(16)
        sock.settimeout(0.1)
        return sock

    def _serve_tcp(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._sock.accept()
            except OSError:
                continue
            with conn:
                self.peers.append(peer[0])
                with contextlib.suppress(OSError):
                    conn.sendall(f"{self.label} {_original_dst(conn)}".encode())

    def _serve_udp(self) -> None:
        while not self._stop.is_set():
            try:
                _, peer = self._sock.recvfrom(512)
            except OSError:
                continue
            self.peers.append(peer[0])
            with contextlib.suppress(OSError):
                self._sock.sendto(self.label.encode(), peer)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


@contextlib.contextmanager
def listening(*specs: tuple[Any, ...]) -> Iterator[list[Listener]]:
    """Listeners for ``(netns, host, port, label[, udp])`` specs, all closed afterwards."""
    made: list[Listener] = []
    try:
        for spec in specs:
            made.append(Listener(*spec[:4], udp=bool(spec[4]) if len(spec) > 4 else False))
        yield made
    finally:
        for listener in made:
            listener.close()


def tcp_as(netns_path: str, uid: int, host: str, port: int) -> str:
    """Connect from ``netns_path`` as ``uid`` (a subprocess); the server's reply or ``error: …``."""

    def run() -> str:
        done = subprocess.run(
            [PYTHON, "-I", "-S", "-c", _CLIENT, host, str(port)],
            user=uid,
            group=uid,
            extra_groups=[],
            cwd="/",
            env={},
            capture_output=True,
            text=True,
            timeout=15,
        )
        return done.stdout or f"error: rc={done.returncode} {done.stderr.strip()}"

    return netns.run_in(netns_path, run)


def udp_query(netns_path: str, host: str, port: int, payload: bytes = b"q") -> str:
    """One datagram from ``netns_path``; the reply's text or ``"timeout"``."""

    def run() -> str:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(3)
            sock.connect((host, port))
            sock.send(payload)
            try:
                return sock.recv(512).decode()
            except TimeoutError:
                return "timeout"

    return netns.run_in(netns_path, run)


def veth(a: str, a_ifname: str, a_addrs: Sequence[str], b: str, b_ifname: str, b_addrs: Sequence[str]) -> None:
    """A veth pair between namespaces ``a`` and ``b`` (paths), up, with ``addr/len`` addresses."""
    from pyroute2 import IPRoute

    tmp = f"vt{abs(hash((a, b))) % 10**8}"

    def create() -> None:
        with IPRoute() as ipr:
            ipr.link("add", ifname=a_ifname, kind="veth", peer=tmp)
            peer = ipr.link_lookup(ifname=tmp)[0]
            fd = netns.open_netns(b)
            try:
                ipr.link("set", index=peer, net_ns_fd=fd)
            finally:
                import os

                os.close(fd)
            configure(ipr, a_ifname, a_addrs)

    def configure(ipr: IPRoute, ifname: str, addrs: Sequence[str]) -> None:
        index = ipr.link_lookup(ifname=ifname)[0]
        for cidr in addrs:
            addr, length = cidr.split("/")
            ipr.addr("add", index=index, address=addr, prefixlen=int(length))
        ipr.link("set", index=index, state="up")

    def finish() -> None:
        with IPRoute() as ipr:
            index = ipr.link_lookup(ifname=tmp)[0]
            ipr.link("set", index=index, ifname=b_ifname)
            configure(ipr, b_ifname, b_addrs)

    netns.run_in(a, create)
    netns.run_in(b, finish)
