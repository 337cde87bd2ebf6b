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

After each ADD it served, the daemon watches the caller's host namespace and puts pycni's
nftables state back when a firewall reload removes it (:mod:`.heal`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import errno
import json
import os
import selectors
import socket
import struct
import threading
import time
from typing import TextIO

import attrs

from pycni import netns
from pycni._version import __version__
from pycni.sdk import Plugin, builtin_plugin, builtin_plugins, cancel, default_state_dir, environment, logs
from pycni.sdk.skel import respond

from ..kernel import links
from ..kernel.firewalld import bus_address
from .heal import Healer
from .logs import CAPTURED, field, log, logging_to
from .request import ACCEPTED, Fallback, Gone, Request, error_outcome, receive, result_frame, try_again
from .sockets import listen, notify_ready, systemd_listener

__all__ = ["Limits", "Daemon", "run"]

_CLONE_FS = 0x200
_SEND_TIMEOUT = 10.0


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


def _file_id(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _own_working_directory() -> None:
    """Give this thread its own cwd (``unshare(CLONE_FS)``): each request takes its caller's."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_FS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_FS): {os.strerror(err)}")


def _worker_init() -> None:
    _own_working_directory()
    links.keep_iproutes()


class Daemon:
    """Serves shim requests on ``listener`` until :meth:`stop` (which a signal handler may call)."""

    def __init__(
        self, listener: socket.socket, *, path: str, owned: bool, limits: Limits | None = None, heal: bool = True
    ) -> None:
        self.listener = listener
        self.healer = Healer() if heal else None
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
        if self.healer is not None:
            self.healer.stop()
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
        request = Request(conn, pid)
        try:
            try:
                outcome = self._serve(request, uid)
            except Fallback as e:
                outcome = f"fallback ({e})"
                with contextlib.suppress(OSError):
                    conn.sendall(b"F" + str(e).encode())
            except Gone as e:
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
        fields = (field(request.plugin_type), field(request.command), field(request.env.get("CNI_CONTAINERID", "-")))
        log.info("%s %s %s %s %.1fms", *fields, outcome, ms)

    def _serve(self, request: Request, uid: int) -> str:
        conn = request.conn
        if uid not in (0, os.geteuid()):
            raise Fallback(f"caller uid {uid} is neither root nor the daemon's")
        try:
            same_mounts = _file_id(f"/proc/{request.pid}/ns/mnt") == self._mnt
            same_root = _file_id(f"/proc/{request.pid}/root") == self._root
        except FileNotFoundError:
            raise Gone(f"caller pid {request.pid} vanished") from None
        except OSError as e:  # out of fds, typically: the shim can do without us
            raise Fallback(f"cannot check the caller: {e.strerror}") from None
        if not same_mounts:
            raise Fallback("caller in another mount namespace")
        if not same_root:
            raise Fallback("caller has another root directory")
        if receive(request, read_timeout=self.limits.read_timeout, max_request=self.limits.max_request):
            reply = json.dumps({"pid": os.getpid(), "version": __version__, "socket": self.path})
            conn.sendall(b"P" + reply.encode())
            return "ping"
        plugin = builtin_plugin(request.plugin_type)
        if plugin is None:
            raise Fallback(f"no built-in plugin {field(request.plugin_type)}")
        if request.env.get("PYCNI_FAILPOINTS"):
            raise Fallback("PYCNI_FAILPOINTS asks for faults in the plugin's own process")
        if request.env.get(logs.LEVEL_ENV):
            # A plugin told its level formats its own log lines; the daemon sends back only the
            # warnings, bare, as a plugin told nothing prints them.
            raise Fallback(f"{logs.LEVEL_ENV} asks for the plugin's own log on its stderr")
        request.deadline = time.monotonic() + self.limits.deadline
        waited = self._acquire(request)
        if waited is not None:
            if waited == "":
                raise Gone("caller left while waiting for a worker")
            if not request.required:
                raise Fallback(waited)
            conn.settimeout(_SEND_TIMEOUT)
            conn.sendall(result_frame(1, try_again(waited)))
            return "busy (error 11)"
        try:
            return self._started(plugin, request)
        finally:
            request.close()  # the caller's lock fds are released before it hears the answer
            self._release()

    def _started(self, plugin: Plugin, request: Request) -> str:
        conn = request.conn
        if request.gone():
            raise Gone("caller left before the request started")
        # From here on the plugin may change the kernel: if the daemon dies, only commands
        # that are safe to repeat run again in the shim; an ADD answers "try again later".
        if request.command == "ADD":
            on_loss = try_again("pycni serve went away during ADD; what it did is undone by DEL")
            accepted_frame = ACCEPTED.pack(b"A", 1, 1, len(on_loss)) + on_loss
        else:
            accepted_frame = ACCEPTED.pack(b"A", 0, 0, 0)
        conn.settimeout(_SEND_TIMEOUT)
        try:
            conn.sendall(accepted_frame)
        except OSError:
            raise Gone("caller left before the request started") from None
        request.accepted = True
        status, out, err = self._in_worker(plugin, request, request.env, request.stdin)
        outcome = "ok" if status == 0 else error_outcome(out)
        if request.gone():
            if request.command == "ADD" and status == 0:
                return "ok, caller gone before the answer: " + self._undo(plugin, request, out)
            return outcome + ", caller gone before the answer"
        try:
            conn.sendall(result_frame(status, out, err))
        except OSError:
            outcome += ", caller gone before the answer"
        return outcome

    def _undo(self, plugin: Plugin, request: Request, result: bytes) -> str:
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
        return "undone by DEL" if status == 0 else f"DEL to undo it failed: {error_outcome(out)}"

    def _in_worker(
        self, plugin: Plugin, request: Request, env: dict[str, str], stdin: bytes, *, cancellable: bool = True
    ) -> tuple[int, bytes, bytes]:
        scope = cancel.Scope(
            request.cancelled if cancellable else (lambda: None), blocked=self._release, unblocked=self._reacquire
        )
        return self._pool.submit(self._run, plugin, request, env, stdin, scope).result()

    def _acquire(self, request: Request) -> str | None:
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

    def _run(
        self, plugin: Plugin, request: Request, env_in: dict[str, str], stdin: bytes, scope: cancel.Scope
    ) -> tuple[int, bytes, bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CNI_", "PYCNI_"))}
        env.update(env_in)
        path = env.get("CNI_NETNS", "")
        captured: list[str] = []
        token = CAPTURED.set(captured)
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
            if status == 0 and env.get("CNI_COMMAND") == "ADD":
                self._watch(request, env)
        finally:
            CAPTURED.reset(token)
        return status, out, "".join(captured).encode("utf-8", "surrogateescape")

    def _watch(self, request: Request, env: dict[str, str]) -> None:
        """After a successful ADD: heal the caller's host namespace (``fds[0]``) if the plugin
        left nftables records in the state dir (resolved from the caller's cwd, which the
        worker has taken; the iptables compatibility step's records are there too), and
        watch firewalld's reloads if it recorded firewalld sources there (on the system bus
        the plugins use: the daemon's) — a firewall plugin's ADD, alone or in a chain (any type
        whose ADD left those records: the watch is once per state dir and bus)."""
        if self.healer is None:
            return
        state_dir = os.path.abspath(default_state_dir(env))
        if os.path.isdir(os.path.join(state_dir, "nft")):
            try:
                self.healer.watch(request.fds[0], state_dir)
            except OSError as e:  # out of fds, typically: no healing there until the next ADD
                log.warning("heal: cannot watch the caller's namespace: %s", e.strerror)
        if os.path.isdir(os.path.join(state_dir, "firewalld")):
            self.healer.watch_firewalld(state_dir, bus_address(env))


def _raise_fd_limit() -> None:
    """Soft fd limit up to the hard one: systemd's default soft 1024 is a few dozen requests'
    worth of fds."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):  # an unlimited hard limit is above fs.nr_open
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run(
    path: str,
    limits: Limits | None = None,
    stream: TextIO | None = None,
    *,
    heal: bool = True,
    level: int | None = None,
    fmt: str = "text",
) -> None:
    """``pycni serve``: serve in the foreground until SIGTERM/SIGINT, logging to ``stream`` at
    ``level`` (:func:`.logs.logging_to`) in ``fmt``; tells systemd when it listens."""
    import signal
    import sys

    with logging_to(stream or sys.stderr, level, fmt):
        _raise_fd_limit()
        builtin_plugins()  # import them all now, not in the first request
        listener = systemd_listener()
        owned = listener is None
        if listener is None:
            listener = listen(path)
        else:
            path = listener.getsockname() or path
        daemon = Daemon(listener, path=path, owned=owned, limits=limits, heal=heal)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: daemon.stop())
        notify_ready()
        daemon.serve_forever()
