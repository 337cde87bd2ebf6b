"""The daemon's socket: bound safely (a private directory, a stale socket replaced, a live one
refused), or the one systemd passed; telling systemd it listens (sd_notify); and a ping, to tell
whether a daemon answers on it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
from collections.abc import MutableMapping

from pycni._fs import unsafe_ancestor
from pycni.errors import CNIError, ErrorCode

from .request import PING

__all__ = ["DaemonError", "listen", "systemd_listener", "notify_ready", "check"]


class DaemonError(CNIError):
    """The daemon cannot start (socket in use, unsafe directory, bad systemd socket)."""

    default_code = ErrorCode.INTERNAL


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def listen(path: str) -> socket.socket:
    """Bind ``path`` (its directory made 0700 if missing and required to be 0700 and ours, and
    no ancestor another uid could swap; the socket 0600); a stale socket nobody answers on is
    replaced, a live one is an error."""
    directory = os.path.dirname(os.path.abspath(path))
    unsafe = unsafe_ancestor(directory)
    if unsafe:
        raise DaemonError(f"another user could replace the socket directory {directory}", unsafe)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.stat(directory)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise DaemonError(
            f"socket directory {directory} must be owned by uid {os.geteuid()} with mode 0700",
            f"it is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}",
        )
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise DaemonError(f"{path} exists and is not a socket")
        if _answers(path):
            raise DaemonError(f"a daemon already answers on {path}")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        raise DaemonError(f"cannot bind {path}: {e.strerror}") from None
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock


def systemd_listener(environ: MutableMapping[str, str] = os.environ) -> socket.socket | None:
    """The socket systemd passed (``LISTEN_FDS``, fd 3) if it passed one to this process; the
    variables are removed so that nothing this daemon runs inherits them."""
    if environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    count = environ.get("LISTEN_FDS", "")
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        environ.pop(name, None)
    if count != "1":
        raise DaemonError(f"systemd passed LISTEN_FDS={count!r}; pycni serve takes exactly one socket")
    try:
        sock = socket.socket(fileno=3)
    except OSError as e:
        raise DaemonError(f"fd 3, which systemd passed, is not a socket: {e.strerror}") from None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise DaemonError("the socket systemd passed is not a unix stream socket")
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise DaemonError("the socket systemd passed is not listening")
    sock.set_inheritable(False)
    return sock


def notify_ready(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Tell systemd (``Type=notify``) the daemon listens: ``READY=1`` to ``$NOTIFY_SOCKET`` (a
    path, or ``@name`` in the abstract namespace), which is then removed so that nothing this
    daemon runs inherits it. Whether a message was sent; a socket that refuses it is reported
    once and otherwise ignored (the daemon serves either way)."""
    address = environ.pop("NOTIFY_SOCKET", "")
    if not address:
        return False
    target = b"\0" + os.fsencode(address[1:]) if address.startswith("@") else os.fsencode(address)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(b"READY=1", target)
    except OSError as e:
        logging.getLogger("pycni.serve").warning("cannot notify systemd on %s: %s", address, e.strerror or e)
        return False
    return True


def check(path: str, timeout: float = 5.0) -> tuple[bool, str]:
    """Whether a daemon answers on ``path``, and a line saying so."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(PING)
            chunks = []
            while chunk := s.recv(1 << 16):
                chunks.append(chunk)
    except OSError as e:
        return False, f"no pycni daemon answers on {path}: {e.strerror or e}"
    answer = b"".join(chunks)
    if answer[:1] != b"P":
        return False, f"the daemon on {path} does not serve this caller (it asks it to run plugins itself)"
    info = json.loads(answer[1:])
    return True, f"pycni serve answers on {path} (pid {info['pid']}, pycni {info['version']})"
