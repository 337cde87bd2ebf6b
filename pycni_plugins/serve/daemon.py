"""The daemon behind the shims: each request runs the built-in plugin in-process, in exactly the
namespaces the caller passed, through the same :func:`pycni.sdk.skel.respond` an exec'd
plugin uses — so the bytes that go back are the ones the plugin would have printed.

One thread per connection reads and checks the request; a fixed pool of ``workers`` threads runs
the plugins (long-lived, so that what a plugin keeps per thread — its libnftables context, whose
socket is costly to close, and its ``IPRoute`` (:func:`~pycni_plugins.kernel.links.keep_iproutes`),
each for the namespace it was last used in — serves the next request too). Before anything runs, the caller must
be root or this daemon's uid (``SO_PEERCRED``) and live in this daemon's mount namespace (paths
— cache dir, dataDir, state dir — must resolve as the caller sees them); otherwise, and for
requests the daemon should not serve (too large, fault injection asked for, an fd that is not a
network namespace), the shim is told to run the plugin itself. At most ``workers`` requests run
at once and ``queue`` more wait up to ``wait`` seconds; beyond that the answer is CNI error 11
(try again later). A running request finishes even if its caller goes away; it holds the
caller's inherited fds (the runtime's container lock) until the plugin is done. The worker
enters the caller's network namespace (``setns`` on the fd it sent) and binds ``CNI_NETNS`` to
the fd the caller opened (:func:`pycni.netns.bound`); the plugin sees the caller's
``CNI_*``/``PYCNI_*`` variables (:func:`pycni.sdk.environment`) and its warnings go to the
caller's stderr, as they would in an exec'd plugin. The wire format is described in
:mod:`.shim`.
"""

from __future__ import annotations

import array
import concurrent.futures
import contextlib
import contextvars
import fcntl
import json
import logging
import os
import selectors
import socket
import stat
import struct
import threading
import time
from collections.abc import Iterator, MutableMapping
from typing import TextIO

import attrs

from pycni import netns
from pycni._version import __version__
from pycni.errors import CNIError, ErrorCode
from pycni.sdk import Plugin, builtin_plugin, builtin_plugins, environment
from pycni.sdk.skel import error_output, respond

from ..kernel import links

__all__ = ["Limits", "Daemon", "DaemonError", "listen", "systemd_listener", "check", "run"]

log = logging.getLogger("pycni.serve")

MAGIC = b"PYCNI\x01"
PING = b"PYCNI?"
_HEADER = struct.Struct("<6s5I")
_RESULT = struct.Struct("<cIII")
_ACCEPTED = struct.Struct("<cBII")
_NS_GET_NSTYPE = 0xB703
_MAX_FDS = 253
_SEND_TIMEOUT = 10.0
_CAPTURED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("pycni_serve_stderr", default=None)


class DaemonError(CNIError):
    """The daemon cannot start (socket in use, unsafe directory, bad systemd socket)."""

    default_code = ErrorCode.INTERNAL


@attrs.frozen
class Limits:
    """``workers`` requests run at once, ``queue`` more wait up to ``wait`` s (then error 11);
    a request is at most ``max_request`` bytes and must arrive within ``read_timeout`` s; on
    SIGTERM, running requests get ``drain`` s to finish."""

    workers: int = 4
    queue: int = 64
    wait: float = 10.0
    max_request: int = 1 << 20
    read_timeout: float = 5.0
    drain: float = 30.0


class _Fallback(Exception):
    """Tell the shim to run the plugin itself; the message is the log line's outcome."""


class _Gone(Exception):
    """The caller vanished or spoke gibberish: close without an answer."""


def _is_netns(fd: int) -> bool:
    try:
        return fcntl.ioctl(fd, _NS_GET_NSTYPE) == netns.CLONE_NEWNET
    except OSError:
        return False


def _mount_ns(pid: int | str) -> tuple[int, int]:
    st = os.stat(f"/proc/{pid}/ns/mnt")
    return st.st_dev, st.st_ino


def _result_frame(status: int, out: bytes, err: bytes = b"") -> bytes:
    return _RESULT.pack(b"R", status, len(out), len(err)) + out + err


def _try_again(msg: str) -> bytes:
    return error_output(CNIError(msg, code=ErrorCode.TRY_AGAIN_LATER))


class _Request:
    """One decoded request: its fds are closed by :meth:`close`, whatever happened."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.plugin_type = "-"
        self.env: dict[str, str] = {}
        self.stdin = b""
        self.has_netns_fd = False
        self.netns_errno = 0
        self.accepted = False  # the shim has been told the request started

    @property
    def command(self) -> str:
        return self.env.get("CNI_COMMAND") or "-"

    @property
    def container_id(self) -> str:
        cid = self.env.get("CNI_CONTAINERID") or "-"
        return cid if cid.isprintable() and " " not in cid else repr(cid)  # one line, one field

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []


class Daemon:
    """Serves shim requests on ``listener`` until :meth:`stop` (which a signal handler may call)."""

    def __init__(self, listener: socket.socket, *, path: str, owned: bool, limits: Limits | None = None) -> None:
        self.listener = listener
        self.path = path
        self.owned = owned  # we made the socket file (not systemd): remove it when stopping
        self.limits = limits or Limits()
        self._slots = threading.Semaphore(self.limits.workers)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            self.limits.workers, thread_name_prefix="pycni-serve-worker", initializer=links.keep_iproutes
        )
        self._lock = threading.Condition()
        self._handling = 0  # connections being handled (waiting or running)
        self._running = 0
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._mnt = _mount_ns("self")
        self._socket_id = self._file_id()

    def _file_id(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def stop(self) -> None:
        """Stop accepting; :meth:`serve_forever` then lets running requests finish (async-signal-safe)."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def serve_forever(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        log.info(
            "serving on %s (pid %d, pycni %s, %d workers)", self.path, os.getpid(), __version__, self.limits.workers
        )
        try:
            while not self._stopping.is_set():
                for key, _ in sel.select():
                    if key.fileobj is self.listener and not self._stopping.is_set():
                        with contextlib.suppress(BlockingIOError, InterruptedError):
                            conn, _ = self.listener.accept()
                            self._dispatch(conn)
        finally:
            sel.close()
            self.listener.close()
            if self.owned and self._socket_id is not None and self._file_id() == self._socket_id:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
        self._drain()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.limits.drain
        with self._lock:
            while self._handling and time.monotonic() < deadline:
                self._lock.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            left = self._handling
        self._pool.shutdown(wait=False)
        if left:
            log.warning("stopped with %d request(s) still running after %gs", left, self.limits.drain)
        else:
            log.info("stopped")

    def _dispatch(self, conn: socket.socket) -> None:
        with self._lock:
            full = self._handling >= self.limits.workers + self.limits.queue
            if not full:
                self._handling += 1
        if full:
            log.warning("busy: %d connections waiting or running; answered 'try again later'", self._handling)
            with contextlib.suppress(OSError):
                conn.settimeout(0.5)
                conn.sendall(_result_frame(1, _try_again("pycni serve is busy: too many requests waiting")))
            conn.close()
            return
        threading.Thread(target=self._handle, args=(conn,), name="pycni-serve-request", daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        started = time.monotonic()
        request = _Request()
        try:
            try:
                outcome = self._serve(conn, request)
            except _Fallback as e:
                outcome = f"fallback ({e})"
                with contextlib.suppress(OSError):
                    conn.sendall(b"F")
            except _Gone as e:
                outcome = f"dropped ({e})"
            except Exception as e:  # a bug here must not kill the daemon nor leave the shim waiting
                log.exception("request failed")
                outcome = f"internal error ({type(e).__name__}: {e})"
                if not request.accepted:
                    with contextlib.suppress(OSError):
                        conn.sendall(b"F")
        finally:
            request.close()
            conn.close()
            with self._lock:
                self._handling -= 1
                self._lock.notify_all()
        ms = (time.monotonic() - started) * 1000
        log.info("%s %s %s %s %.1fms", request.plugin_type, request.command, request.container_id, outcome, ms)

    def _serve(self, conn: socket.socket, request: _Request) -> str:
        pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid not in (0, os.geteuid()):
            raise _Fallback(f"caller uid {uid} is neither root nor the daemon's")
        try:
            same_mounts = _mount_ns(pid) == self._mnt
        except OSError:
            raise _Gone(f"caller pid {pid} vanished") from None
        if not same_mounts:
            raise _Fallback("caller in another mount namespace")
        if self._receive(conn, request):
            reply = json.dumps({"pid": os.getpid(), "version": __version__, "socket": self.path})
            conn.sendall(b"P" + reply.encode())
            return "ping"
        plugin = builtin_plugin(request.plugin_type)
        if plugin is None:
            raise _Fallback(f"no built-in plugin {request.plugin_type!r}")
        if request.env.get("PYCNI_FAILPOINTS"):
            raise _Fallback("PYCNI_FAILPOINTS asks for faults in the plugin's own process")
        if not self._acquire():
            if self._stopping.is_set():
                raise _Fallback("shutting down")
            conn.settimeout(_SEND_TIMEOUT)
            waited = f"{self.limits.workers} running, waited {self.limits.wait:g}s"
            conn.sendall(_result_frame(1, _try_again(f"pycni serve is busy: {waited}")))
            return "busy (error 11)"
        try:
            # From here on the plugin may change the kernel: if the daemon dies, only commands
            # that are safe to repeat run again in the shim; an ADD answers "try again later".
            if request.command == "ADD":
                on_loss = _try_again("pycni serve went away during ADD; what it did is undone by DEL")
                accepted_frame = _ACCEPTED.pack(b"A", 1, 1, len(on_loss)) + on_loss
            else:
                accepted_frame = _ACCEPTED.pack(b"A", 0, 0, 0)
            conn.settimeout(_SEND_TIMEOUT)
            try:
                conn.sendall(accepted_frame)
            except OSError:
                raise _Gone("caller left before the request started") from None
            request.accepted = True
            status, out, err = self._pool.submit(self._run, plugin, request).result()
        finally:
            request.close()  # the caller's lock fds are released before it hears the answer
            self._release()
        outcome = "ok" if status == 0 else _error_outcome(out)
        try:
            conn.sendall(_result_frame(status, out, err))
        except OSError:
            outcome += ", caller gone before the answer"
        return outcome

    def _acquire(self) -> bool:
        deadline = time.monotonic() + self.limits.wait
        while not self._stopping.is_set():
            if self._slots.acquire(timeout=min(0.1, max(0.0, deadline - time.monotonic()))):
                if self._stopping.is_set():
                    self._slots.release()
                    return False
                with self._lock:
                    self._running += 1
                return True
            if time.monotonic() >= deadline:
                return False
        return False

    def _release(self) -> None:
        with self._lock:
            self._running -= 1
        self._slots.release()

    def _receive(self, conn: socket.socket, request: _Request) -> bool:
        """Read and decode the request into ``request``; True for a ping."""
        deadline = time.monotonic() + self.limits.read_timeout
        buf = bytearray()

        def fill(n: int) -> None:
            while len(buf) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Gone("request not sent in time")
                conn.settimeout(left)
                try:
                    data, ancillary, flags, _ = conn.recvmsg(
                        min(n - len(buf), 1 << 16), socket.CMSG_SPACE(_MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
                    )
                except OSError as e:
                    raise _Gone(f"reading the request: {e}") from None
                for level, kind, payload in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds = array.array("i")
                        fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                        request.fds.extend(fds)
                if flags & socket.MSG_CTRUNC:
                    raise _Fallback("too many fds")
                if not data:
                    raise _Gone("caller closed before sending the request")
                buf.extend(data)

        fill(len(PING))
        if bytes(buf) == PING:
            return True
        fill(_HEADER.size)
        magic, n_type, n_env, n_stdin, has_fd, netns_errno = _HEADER.unpack_from(buf)
        if magic != MAGIC:
            raise _Gone("not a pycni shim request")
        total = _HEADER.size + n_type + n_env + n_stdin
        if total > self.limits.max_request:
            raise _Fallback(f"request of {total} bytes over the {self.limits.max_request} limit")
        fill(total)
        at = _HEADER.size
        request.plugin_type = buf[at : at + n_type].decode("ascii", "replace")
        at += n_type
        encoding = "utf-8"
        for pair in bytes(buf[at : at + n_env]).split(b"\0") if n_env else ():
            name, sep, value = pair.partition(b"=")
            if sep:
                request.env[name.decode(encoding, "surrogateescape")] = value.decode(encoding, "surrogateescape")
        request.stdin = bytes(buf[at + n_env : total])
        request.has_netns_fd, request.netns_errno = bool(has_fd), netns_errno
        wanted = 2 if has_fd else 1
        if len(request.fds) < wanted or not all(_is_netns(fd) for fd in request.fds[:wanted]):
            raise _Fallback("the namespace fds sent are not network namespaces")
        if (has_fd or netns_errno) and not request.env.get("CNI_NETNS"):
            raise _Fallback("a CNI_NETNS fd without CNI_NETNS")
        return False

    def _run(self, plugin: Plugin, request: _Request) -> tuple[int, bytes, bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CNI_", "PYCNI_"))}
        env.update(request.env)
        path = env.get("CNI_NETNS", "")
        captured: list[str] = []
        token = _CAPTURED.set(captured)
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(netns.entered(request.fds[0]))
                stack.enter_context(environment(env))
                if request.has_netns_fd:
                    stack.enter_context(netns.bound(path, request.fds[1]))
                elif request.netns_errno:
                    stack.enter_context(netns.bound(path, None, request.netns_errno))
                status, out = respond(plugin, request.plugin_type, env, request.stdin)
        finally:
            _CAPTURED.reset(token)
        return status, out, "".join(captured).encode("utf-8", "surrogateescape")


def _error_outcome(out: bytes) -> str:
    try:
        return f"error (code {json.loads(out)['code']})"
    except (ValueError, KeyError, TypeError):
        return "error"


# -- sockets -----------------------------------------------------------------------------------


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def listen(path: str) -> socket.socket:
    """Bind ``path`` (its directory made 0700 if missing and required to be 0700 and ours; the
    socket 0600); a stale socket nobody answers on is replaced, a live one is an error."""
    directory = os.path.dirname(os.path.abspath(path))
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
    sock = socket.socket(fileno=3)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise DaemonError("the socket systemd passed is not a unix stream socket")
    sock.set_inheritable(False)
    return sock


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


# -- running it --------------------------------------------------------------------------------


class _Route(logging.Handler):
    """Records logged while a request runs go to that request's stderr (as an exec'd plugin's
    ``logging.lastResort`` would print them); the daemon's own go to its log."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        self.plain = logging.Formatter()
        self.daemon = logging.Formatter("%(asctime)s.%(msecs)03dZ pycni serve: %(message)s", "%Y-%m-%dT%H:%M:%S")
        self.daemon.converter = time.gmtime

    def emit(self, record: logging.LogRecord) -> None:
        sink = _CAPTURED.get()
        if sink is not None and not record.name.startswith(log.name):
            if record.levelno >= logging.WARNING:
                sink.append(self.plain.format(record) + "\n")
            return
        try:
            self.stream.write(self.daemon.format(record) + "\n")
            self.stream.flush()
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def _logging_to(stream: TextIO) -> Iterator[None]:
    root = logging.getLogger()
    handler = _Route(stream)
    root.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)


def run(path: str, limits: Limits | None = None, stream: TextIO | None = None) -> None:
    """``pycni serve``: serve in the foreground until SIGTERM/SIGINT, logging to ``stream``."""
    import signal
    import sys

    with _logging_to(stream or sys.stderr):
        builtin_plugins()  # import them all now, not in the first request
        listener = systemd_listener()
        owned = listener is None
        if listener is None:
            listener = listen(path)
        else:
            path = listener.getsockname() or path
        daemon = Daemon(listener, path=path, owned=owned, limits=limits)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: daemon.stop())
        daemon.serve_forever()
