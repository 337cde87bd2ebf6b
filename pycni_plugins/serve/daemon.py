"""The daemon behind the shims: each request runs the built-in plugin in-process, in exactly the
namespaces the caller passed, through the same :func:`pycni.sdk.skel.respond` an exec'd
plugin uses — so the bytes that go back are the ones the plugin would have printed.

One thread per connection reads and checks the request; a pool of worker threads runs the
plugins (long-lived, so that what a plugin keeps per thread — its libnftables context, whose
socket is costly to close, and its ``IPRoute`` (:func:`~pycni_plugins.kernel.links.keep_iproutes`),
each for the namespace it was last used in — serves the next request too). Each worker has its
own working directory (``unshare(CLONE_FS)``) and takes the caller's (an fd the shim sends)
for each request, so relative paths resolve as they would in an exec'd plugin.

Before anything runs, the caller must be root or this daemon's uid (``SO_PEERCRED``) and share
this daemon's mount namespace and root; otherwise, and for requests the daemon should not serve
(too large, too many fds, fault injection asked for, an fd that is not what it should be), the
shim is told to run the plugin itself (``F``). At most ``workers`` requests run at once; a
request blocked on a lock (:mod:`pycni.sdk.cancel`) does not count, so one stuck network does
not starve the others. ``queue`` more connections wait up to ``wait`` seconds for a worker, at
most ``per_peer`` from one process; a busy daemon answers ``F`` too, unless the caller says
``PYCNI_DAEMON=required`` (then CNI error 11, try again later).

A request ends when its caller hangs up or ``deadline`` passes: one not yet started never starts,
one waiting for a lock gives up (and fails as a failed ADD does, undoing what it made), and an
ADD that completed for a caller gone before the answer is undone by a DEL. It holds the caller's
inherited fds (the runtime's container lock) until then. The worker enters the caller's network
namespace (``setns`` on the fd it sent) and binds ``CNI_NETNS`` to the fd the caller opened
(:func:`pycni.netns.bound`); the plugin sees the caller's ``CNI_*``/``PYCNI_*`` variables
(:func:`pycni.sdk.environment`) and its warnings go to the caller's stderr, as they would in an
exec'd plugin. The wire format is described in :mod:`.shim`.
"""

from __future__ import annotations

import array
import concurrent.futures
import contextlib
import contextvars
import ctypes
import errno
import json
import logging
import os
import select
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
from pycni._fs import unsafe_ancestor
from pycni._version import __version__
from pycni.errors import CNIError, ErrorCode
from pycni.sdk import Plugin, builtin_plugin, builtin_plugins, cancel, environment
from pycni.sdk.skel import error_output, respond
from pycni.sdk.validate import NAME_PATTERN

from ..kernel import links

__all__ = ["Limits", "Daemon", "DaemonError", "listen", "systemd_listener", "check", "run"]

log = logging.getLogger("pycni.serve")

MAGIC = b"PYCNI\x02"
PING = b"PYCNI?"
_HEADER = struct.Struct("<6s5I")
_RESULT = struct.Struct("<cIII")
_ACCEPTED = struct.Struct("<cBII")
_CLONE_FS = 0x200
#: fds one request may carry: own netns, cwd, CNI_NETNS and the caller's few lock fds.
MAX_FDS = 16
_TYPE_MAX = 255  # a plugin type is a file name
_SEND_TIMEOUT = 10.0
_HUNG_UP = select.POLLIN | select.POLLRDHUP | select.POLLHUP | select.POLLERR
_CAPTURED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("pycni_serve_stderr", default=None)


class DaemonError(CNIError):
    """The daemon cannot start (socket in use, unsafe directory, bad systemd socket)."""

    default_code = ErrorCode.INTERNAL


@attrs.frozen
class Limits:
    """``workers`` requests run at once (one blocked on a lock does not count); ``queue`` more
    connections wait up to ``wait`` s, at most ``per_peer`` from one process; a request is at
    most ``max_request`` bytes, must arrive within ``read_timeout`` s and gives up after
    ``deadline`` s; on SIGTERM, running requests get ``drain`` s to finish."""

    workers: int = 4
    queue: int = 64
    wait: float = 10.0
    max_request: int = 1 << 20
    read_timeout: float = 2.0
    deadline: float = 120.0
    per_peer: int = 4
    drain: float = 30.0


class _Fallback(Exception):
    """Tell the shim to run the plugin itself; the message is the log line's outcome."""


class _Gone(Exception):
    """The caller vanished or spoke gibberish: close without an answer."""


def _field(text: str, limit: int = 80) -> str:
    """``text`` as one log field: as it is when printable without spaces, else quoted (and cut),
    so no value can forge a line or shift the fields after it."""
    if text and len(text) <= limit and text.isprintable() and " " not in text:
        return text
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def _is_dir(fd: int) -> bool:
    try:
        return stat.S_ISDIR(os.fstat(fd).st_mode)
    except OSError:
        return False


def _file_id(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _result_frame(status: int, out: bytes, err: bytes = b"") -> bytes:
    return _RESULT.pack(b"R", status, len(out), len(err)) + out + err


def _try_again(msg: str) -> bytes:
    return error_output(CNIError(msg, code=ErrorCode.TRY_AGAIN_LATER))


def _own_working_directory() -> None:
    """Give this thread its own cwd (``unshare(CLONE_FS)``): each request takes its caller's."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_FS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_FS): {os.strerror(err)}")


def _worker_init() -> None:
    _own_working_directory()
    links.keep_iproutes()


class _Request:
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


class Daemon:
    """Serves shim requests on ``listener`` until :meth:`stop` (which a signal handler may call)."""

    def __init__(self, listener: socket.socket, *, path: str, owned: bool, limits: Limits | None = None) -> None:
        self.listener = listener
        self.path = path
        self.owned = owned  # we made the socket file (not systemd): remove it when stopping
        self.limits = limits or Limits()
        self._slots = threading.Semaphore(self.limits.workers)
        # A thread per connection at most: blocked requests hold a thread but not a slot.
        self._pool = concurrent.futures.ThreadPoolExecutor(
            self.limits.workers + self.limits.queue, thread_name_prefix="pycni-serve-worker", initializer=_worker_init
        )
        self._lock = threading.Condition()
        self._handling = 0  # connections being handled (waiting or running)
        self._per_peer: dict[int, int] = {}
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._reserve: int | None = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        self._shed_logged = 0.0
        self._mnt = _file_id("/proc/self/ns/mnt")
        self._root = _file_id("/")
        self._socket_id = self._path_id()

    def _path_id(self) -> tuple[int, int] | None:
        try:
            return _file_id(self.path)
        except OSError:
            return None

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
                        self._accept()
        finally:
            sel.close()
            self.listener.close()
            if self.owned and self._socket_id is not None and self._path_id() == self._socket_id:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
        self._drain()

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                raise
            self._shed(e)
            return
        self._dispatch(conn)

    def _shed(self, error: OSError) -> None:
        """Out of fds: close the next connection unanswered (its shim runs the plugin itself)
        with the fd kept in reserve for this, rather than spin on a backlog it cannot accept."""
        now = time.monotonic()
        if now - self._shed_logged > 1.0:
            self._shed_logged = now
            log.warning("cannot accept: %s; closing connections until fds are free", error.strerror)
        if self._reserve is None:
            time.sleep(0.01)
        else:
            os.close(self._reserve)
            self._reserve = None
            with contextlib.suppress(OSError):
                self.listener.accept()[0].close()
        with contextlib.suppress(OSError):
            self._reserve = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)

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
        try:
            pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        except OSError:
            conn.close()
            return
        with self._lock:
            if self._handling >= self.limits.workers + self.limits.queue:
                busy = f"{self._handling} connections waiting or running"
            elif self._per_peer.get(pid, 0) >= self.limits.per_peer:
                busy = f"{self.limits.per_peer} connections from pid {pid} already"
            else:
                busy = ""
                self._handling += 1
                self._per_peer[pid] = self._per_peer.get(pid, 0) + 1
        if busy:
            log.warning("busy: %s; told the caller to run the plugin itself", busy)
            self._refuse(conn, f"pycni serve is busy: {busy}")
            return
        try:
            threading.Thread(
                target=self._handle, args=(conn, pid, uid), name="pycni-serve-request", daemon=True
            ).start()
        except RuntimeError:  # no thread to be had: the shim runs it itself
            self._done(pid)
            self._refuse(conn, "pycni serve cannot start a thread")

    @staticmethod
    def _refuse(conn: socket.socket, reason: str) -> None:
        with contextlib.suppress(OSError):
            conn.setblocking(False)
            conn.send(b"F" + reason.encode())
        conn.close()

    def _done(self, pid: int) -> None:
        with self._lock:
            self._handling -= 1
            left = self._per_peer.pop(pid) - 1
            if left:
                self._per_peer[pid] = left
            self._lock.notify_all()

    def _handle(self, conn: socket.socket, pid: int, uid: int) -> None:
        started = time.monotonic()
        request = _Request(conn, pid)
        try:
            try:
                outcome = self._serve(request, uid)
            except _Fallback as e:
                outcome = f"fallback ({e})"
                with contextlib.suppress(OSError):
                    conn.sendall(b"F" + str(e).encode())
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
            self._done(pid)
        ms = (time.monotonic() - started) * 1000
        fields = (_field(request.plugin_type), _field(request.command), _field(request.env.get("CNI_CONTAINERID", "-")))
        log.info("%s %s %s %s %.1fms", *fields, outcome, ms)

    def _serve(self, request: _Request, uid: int) -> str:
        conn = request.conn
        if uid not in (0, os.geteuid()):
            raise _Fallback(f"caller uid {uid} is neither root nor the daemon's")
        try:
            same_mounts = _file_id(f"/proc/{request.pid}/ns/mnt") == self._mnt
            same_root = _file_id(f"/proc/{request.pid}/root") == self._root
        except FileNotFoundError:
            raise _Gone(f"caller pid {request.pid} vanished") from None
        except OSError as e:  # out of fds, typically: the shim can do without us
            raise _Fallback(f"cannot check the caller: {e.strerror}") from None
        if not same_mounts:
            raise _Fallback("caller in another mount namespace")
        if not same_root:
            raise _Fallback("caller has another root directory")
        if self._receive(request):
            reply = json.dumps({"pid": os.getpid(), "version": __version__, "socket": self.path})
            conn.sendall(b"P" + reply.encode())
            return "ping"
        plugin = builtin_plugin(request.plugin_type)
        if plugin is None:
            raise _Fallback(f"no built-in plugin {_field(request.plugin_type)}")
        if request.env.get("PYCNI_FAILPOINTS"):
            raise _Fallback("PYCNI_FAILPOINTS asks for faults in the plugin's own process")
        request.deadline = time.monotonic() + self.limits.deadline
        waited = self._acquire(request)
        if waited is not None:
            if waited == "":
                raise _Gone("caller left while waiting for a worker")
            if not request.required:
                raise _Fallback(waited)
            conn.settimeout(_SEND_TIMEOUT)
            conn.sendall(_result_frame(1, _try_again(waited)))
            return "busy (error 11)"
        try:
            return self._started(plugin, request)
        finally:
            request.close()  # the caller's lock fds are released before it hears the answer
            self._release()

    def _started(self, plugin: Plugin, request: _Request) -> str:
        conn = request.conn
        if request.gone():
            raise _Gone("caller left before the request started")
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
        status, out, err = self._in_worker(plugin, request, request.env, request.stdin)
        outcome = "ok" if status == 0 else _error_outcome(out)
        if request.gone():
            if request.command == "ADD" and status == 0:
                return "ok, caller gone before the answer: " + self._undo(plugin, request, out)
            return outcome + ", caller gone before the answer"
        try:
            conn.sendall(_result_frame(status, out, err))
        except OSError:
            outcome += ", caller gone before the answer"
        return outcome

    def _undo(self, plugin: Plugin, request: _Request, result: bytes) -> str:
        """DEL what an ADD nobody will hear of made (the runtime, which killed its plugin, never
        learns the result to DEL it), with that result as the DEL's prevResult."""
        env = dict(request.env, CNI_COMMAND="DEL")
        try:
            conf = json.loads(request.stdin)
            conf["prevResult"] = json.loads(result)
            stdin = json.dumps(conf).encode()
        except (ValueError, TypeError):
            stdin = request.stdin
        request.deadline = time.monotonic() + self.limits.deadline
        status, out, _ = self._in_worker(plugin, request, env, stdin, cancellable=False)
        return "undone by DEL" if status == 0 else f"DEL to undo it failed: {_error_outcome(out)}"

    def _in_worker(
        self, plugin: Plugin, request: _Request, env: dict[str, str], stdin: bytes, *, cancellable: bool = True
    ) -> tuple[int, bytes, bytes]:
        scope = cancel.Scope(
            request.cancelled if cancellable else (lambda: None), blocked=self._release, unblocked=self._reacquire
        )
        return self._pool.submit(self._run, plugin, request, env, stdin, scope).result()

    def _acquire(self, request: _Request) -> str | None:
        """Take a worker slot: None once taken, "" if the caller left meanwhile, else why not."""
        deadline = time.monotonic() + self.limits.wait
        while not self._stopping.is_set():
            if self._slots.acquire(timeout=min(0.05, max(0.0, deadline - time.monotonic()))):
                if not self._stopping.is_set():
                    return None
                self._slots.release()
                break
            if request.gone():
                return ""
            if time.monotonic() >= deadline:
                return f"pycni serve is busy: {self.limits.workers} running, waited {self.limits.wait:g}s"
        return "pycni serve is shutting down"

    def _release(self) -> None:
        self._slots.release()

    def _reacquire(self) -> None:
        self._slots.acquire()

    def _receive(self, request: _Request) -> bool:
        """Read and decode the request into ``request``; True for a ping."""
        conn = request.conn
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
                        min(n - len(buf), 1 << 16), socket.CMSG_SPACE(MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
                    )
                except TimeoutError:
                    raise _Gone("request not sent in time") from None
                except OSError as e:
                    raise _Gone(f"reading the request: {e}") from None
                for level, kind, payload in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds = array.array("i")
                        fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                        request.fds.extend(fds)
                if flags & socket.MSG_CTRUNC or len(request.fds) > MAX_FDS:
                    request.close()  # at once: a flood of fds must not fill this process's table
                    raise _Fallback(f"the fds sent did not fit (more than {MAX_FDS}, or this process is out of fds)")
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
        if n_type > _TYPE_MAX:
            raise _Fallback(f"a plugin type of {n_type} bytes")
        fill(total)
        at = _HEADER.size
        plugin_type = buf[at : at + n_type].decode("ascii", "replace")
        request.plugin_type = plugin_type if NAME_PATTERN.fullmatch(plugin_type) else "-"
        if request.plugin_type != plugin_type:
            raise _Fallback(f"{_field(plugin_type)} is not a plugin type")
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
            raise _Fallback("the fds sent are not the network namespaces and working directory expected")
        if (has_fd or netns_errno) and not request.env.get("CNI_NETNS"):
            raise _Fallback("a CNI_NETNS fd without CNI_NETNS")
        return False

    def _run(
        self, plugin: Plugin, request: _Request, env_in: dict[str, str], stdin: bytes, scope: cancel.Scope
    ) -> tuple[int, bytes, bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CNI_", "PYCNI_"))}
        env.update(env_in)
        path = env.get("CNI_NETNS", "")
        captured: list[str] = []
        token = _CAPTURED.set(captured)
        try:
            os.fchdir(request.fds[1])
            with contextlib.ExitStack() as stack:
                stack.enter_context(netns.entered(request.fds[0]))
                stack.enter_context(environment(env))
                stack.enter_context(cancel.scope(scope))
                if request.has_netns_fd:
                    stack.enter_context(netns.bound(path, request.fds[2]))
                elif request.netns_errno:
                    stack.enter_context(netns.bound(path, None, request.netns_errno))
                status, out = respond(plugin, request.plugin_type, env, stdin)
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


def _raise_fd_limit() -> None:
    """Soft fd limit up to the hard one: systemd's default soft 1024 is a few dozen requests'
    worth of fds."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):  # an unlimited hard limit is above fs.nr_open
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run(path: str, limits: Limits | None = None, stream: TextIO | None = None) -> None:
    """``pycni serve``: serve in the foreground until SIGTERM/SIGINT, logging to ``stream``."""
    import signal
    import sys

    with _logging_to(stream or sys.stderr):
        _raise_fd_limit()
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
