"""Probes for proving connectivity between namespaces, for the demo, tests and benchmarks.

Everything runs in Python threads that entered the namespace (:func:`pycni.netns.run_in`), so
no ping or netcat binary is needed: TCP echo servers and clients, and ICMP echo over a raw
socket. Every server is closed when its ``with`` block ends.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import threading
import time

from .. import netns

__all__ = ["TCPEchoServer", "tcp_echo", "ping"]


class TCPEchoServer:
    """Echo every connection's bytes back; listens inside ``netns_path`` on ``port``.

    ``peers`` records the source address of each accepted connection (to see SNAT).
    """

    def __init__(self, netns_path: str | None, port: int, *, host: str = "::") -> None:
        self.netns_path = netns_path
        self.port = port
        self.peers: list[str] = []
        self._sock = netns.run_in(netns_path, self._listen, host)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"echo:{port}", daemon=True)

    def _listen(self, host: str) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, self.port))
        sock.listen(64)
        sock.settimeout(0.2)
        return sock

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            addr = ipaddress.ip_address(peer[0].split("%")[0])
            mapped = getattr(addr, "ipv4_mapped", None)
            self.peers.append(str(mapped or addr))
            with conn:
                conn.settimeout(2)
                try:
                    data = conn.recv(65536)
                    conn.sendall(data)
                except OSError:
                    pass

    def __enter__(self) -> TCPEchoServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


def tcp_echo(netns_path: str | None, address: str, port: int, *, timeout: float = 3.0) -> bool:
    """Connect from inside ``netns_path`` to ``address:port``; True when the payload comes back."""

    def attempt() -> bool:
        payload = os.urandom(16)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect((address, port))
                sock.sendall(payload)
                return sock.recv(64) == payload
            except OSError:
                return False

    return netns.run_in(netns_path, attempt)


_RESEND = 0.25


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def ping(netns_path: str | None, address: str, *, count: int = 1, timeout: float = 2.0) -> bool:
    """ICMP echo (IPv4 or IPv6) from inside ``netns_path``; True when each of ``count`` requests
    is answered within ``timeout``. An unanswered request is sent again every
    :data:`_RESEND` seconds, as ``ping -w`` does: the first may be lost while a neighbour is
    resolved or an address is still tentative (DAD)."""
    ip = ipaddress.ip_address(address)

    def run() -> bool:
        v6 = ip.version == 6
        family, proto = (socket.AF_INET6, socket.IPPROTO_ICMPV6) if v6 else (socket.AF_INET, socket.IPPROTO_ICMP)
        request_type, reply_type = (128, 129) if v6 else (8, 0)
        ident = os.getpid() & 0xFFFF
        with socket.socket(family, socket.SOCK_RAW, proto) as sock:
            for seq in range(count):
                deadline = time.monotonic() + timeout
                resend = 0.0
                while True:
                    now = time.monotonic()
                    if now >= deadline:
                        return False
                    if now >= resend:
                        body = struct.pack("!d", now)
                        header = struct.pack("!BBHHH", request_type, 0, 0, ident, seq)
                        checksum = 0 if v6 else _checksum(header + body)  # the kernel fills ICMPv6 checksums
                        try:
                            sock.sendto(
                                struct.pack("!BBHHH", request_type, 0, checksum, ident, seq) + body, (address, 0)
                            )
                        except OSError:  # no route or source address yet: try again at the next resend
                            pass
                        resend = now + _RESEND
                    sock.settimeout(max(min(deadline, resend) - time.monotonic(), 0.001))
                    try:
                        packet, _ = sock.recvfrom(1024)
                    except TimeoutError:
                        continue
                    icmp = packet if v6 else packet[(packet[0] & 0x0F) * 4 :]
                    kind, _, _, rid, rseq = struct.unpack("!BBHHH", icmp[:8])
                    if kind == reply_type and rid == ident and rseq == seq:
                        break
        return True

    return netns.run_in(netns_path, run)
