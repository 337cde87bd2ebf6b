"""One shim request on the daemon's side: the wire format (:mod:`.shim` describes it), the
request read and checked (its size, its fds: the caller's namespaces and working directory), the
frames that answer it, and the two ways it ends unanswered (:class:`Fallback`: the shim runs the
plugin itself; :class:`Gone`: the caller vanished)."""

from __future__ import annotations

import array
import contextlib
import json
import os
import select
import socket
import stat
import struct
import time

from pycni import netns
from pycni.errors import CNIError, ErrorCode
from pycni.sdk.skel import error_output
from pycni.sdk.validate import NAME_PATTERN

from .logs import field

MAGIC = b"PYCNI\x02"
PING = b"PYCNI?"
_HEADER = struct.Struct("<6s5I")
_RESULT = struct.Struct("<cIII")
ACCEPTED = struct.Struct("<cBII")
#: fds one request may carry: own netns, cwd, CNI_NETNS and the caller's few lock fds.
MAX_FDS = 16
_TYPE_MAX = 255  # a plugin type is a file name
_HUNG_UP = select.POLLIN | select.POLLRDHUP | select.POLLHUP | select.POLLERR


class Fallback(Exception):
    """Tell the shim to run the plugin itself; the message is the log line's outcome."""


class Gone(Exception):
    """The caller vanished or spoke gibberish: close without an answer."""


def _is_dir(fd: int) -> bool:
    try:
        return stat.S_ISDIR(os.fstat(fd).st_mode)
    except OSError:
        return False


def result_frame(status: int, out: bytes, err: bytes = b"") -> bytes:
    return _RESULT.pack(b"R", status, len(out), len(err)) + out + err


def try_again(msg: str) -> bytes:
    return error_output(CNIError(msg, code=ErrorCode.TRY_AGAIN_LATER))


class Request:
    """One decoded request: its fds are closed by :meth:`close`, whatever happened."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.conn = conn
        self.pid = pid
        self.fds: list[int] = []
        self.plugin_type = "-"
        self.env: dict[str, str] = {}
        self.stdin = b""
        self.has_netns_fd = False
        self.netns_errno = 0
        self.accepted = False  # the shim has been told the request started
        self.deadline = float("inf")
        self._poll = select.poll()
        self._poll.register(conn, _HUNG_UP)

    @property
    def command(self) -> str:
        return self.env.get("CNI_COMMAND") or "-"

    @property
    def required(self) -> bool:
        return self.env.get("PYCNI_DAEMON") == "required"

    def gone(self) -> bool:
        """Whether the caller hung up (having sent its whole request, a shim only waits)."""
        return bool(self._poll.poll(0))

    def cancelled(self) -> str | None:
        if self.gone():
            return "its caller hung up"
        if time.monotonic() > self.deadline:
            return "its deadline passed"
        return None

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []


def receive(request: Request, *, read_timeout: float, max_request: int) -> bool:
    """Read and decode the request into ``request``; True for a ping."""
    conn = request.conn
    deadline = time.monotonic() + read_timeout
    buf = bytearray()

    def fill(n: int) -> None:
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Gone("request not sent in time")
            conn.settimeout(left)
            try:
                data, ancillary, flags, _ = conn.recvmsg(
                    min(n - len(buf), 1 << 16), socket.CMSG_SPACE(MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
                )
            except TimeoutError:
                raise Gone("request not sent in time") from None
            except OSError as e:
                raise Gone(f"reading the request: {e}") from None
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                    request.fds.extend(fds)
            if flags & socket.MSG_CTRUNC or len(request.fds) > MAX_FDS:
                request.close()  # at once: a flood of fds must not fill this process's table
                raise Fallback(f"the fds sent did not fit (more than {MAX_FDS}, or this process is out of fds)")
            if not data:
                raise Gone("caller closed before sending the request")
            buf.extend(data)

    fill(len(PING))
    if bytes(buf) == PING:
        return True
    fill(_HEADER.size)
    magic, n_type, n_env, n_stdin, has_fd, netns_errno = _HEADER.unpack_from(buf)
    if magic != MAGIC:
        raise Gone("not a pycni shim request")
    total = _HEADER.size + n_type + n_env + n_stdin
    if total > max_request:
        raise Fallback(f"request of {total} bytes over the {max_request} limit")
    if n_type > _TYPE_MAX:
        raise Fallback(f"a plugin type of {n_type} bytes")
    fill(total)
    at = _HEADER.size
    plugin_type = buf[at : at + n_type].decode("ascii", "replace")
    request.plugin_type = plugin_type if NAME_PATTERN.fullmatch(plugin_type) else "-"
    if request.plugin_type != plugin_type:
        raise Fallback(f"{field(plugin_type)} is not a plugin type")
    at += n_type
    encoding = "utf-8"
    for pair in bytes(buf[at : at + n_env]).split(b"\0") if n_env else ():
        name, sep, value = pair.partition(b"=")
        if sep:
            request.env[name.decode(encoding, "surrogateescape")] = value.decode(encoding, "surrogateescape")
    request.stdin = bytes(buf[at + n_env : total])
    request.has_netns_fd, request.netns_errno = bool(has_fd), netns_errno
    fds = request.fds
    netns_fds = [0, 2] if has_fd else [0]
    namespaces = len(fds) >= len(netns_fds) + 1 and all(netns.is_netns_fd(fds[i]) for i in netns_fds)
    if not namespaces or not _is_dir(fds[1]):
        raise Fallback("the fds sent are not the network namespaces and working directory expected")
    if (has_fd or netns_errno) and not request.env.get("CNI_NETNS"):
        raise Fallback("a CNI_NETNS fd without CNI_NETNS")
    return False


def error_outcome(out: bytes) -> str:
    try:
        return f"error (code {json.loads(out)['code']})"
    except (ValueError, KeyError, TypeError):
        return "error"
