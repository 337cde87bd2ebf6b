"""The shim ``pycni plugins install`` writes for each built-in type (this file is its template).

The installer replaces everything above the body marker line with the shebang
(``#!<python> -IS``) and the constants below, resolved at install time. The body imports only
C modules of the standard library (``posix``, ``sys``, ``_socket``, ``fcntl``), so the shim
starts in a few milliseconds. It knows nothing of CNI: it forwards its environment's ``CNI_*``
and ``PYCNI_*`` variables, its stdin bytes, and open fds of its own network namespace, its
working directory, ``CNI_NETNS`` and whatever it inherited (the runtime's lock fds) to
``pycni serve``, and reproduces the stdout, stderr and exit status the daemon sends back — only
through a socket path no other uid could replace (sshd's StrictModes), and once the listener's
peer credentials say it runs as root or as the shim's own uid (anyone else could forge the
result). It runs the plugin itself (the fallback: the same code the daemon runs, with this
interpreter's own paths and pycni's install only) when ``PYCNI_DAEMON=off``, when no daemon
answers, its path is unsafe or its listener is someone else, when it inherited more fds than
the daemon takes, when the daemon says so (it is busy, say), or when the daemon goes away
before it has started the request — or after, if the daemon said that is safe.
``PYCNI_DAEMON=required`` prints ``UNAVAILABLE`` and exits 1 instead of running the plugin.

Wire format (integers unsigned 32-bit little-endian), one connection per invocation:

* request: ``b"PYCNI\\x02"``, type length, environment length, stdin length, 1 if the third fd
  is ``CNI_NETNS`` else 0, the errno opening ``CNI_NETNS`` failed with (else 0); then the type,
  the ``NAME=value`` pairs separated by NUL, the stdin bytes. The first chunk carries the fds
  (``SCM_RIGHTS``): own netns, working directory, ``CNI_NETNS`` (if flagged), inherited fds
  (16 in all at most).
  ``b"PYCNI?"`` alone asks whether a daemon answers (``pycni serve --check``).
* answer: ``b"F"`` + why (run it yourself), or ``b"A"`` + on-loss mode (1 byte: 0 run it yourself,
  1 print) + status + length + bytes — what to print if the connection ends before the result
  — then ``b"R"`` + status + stdout length + stderr length + stdout + stderr.
"""

PLUGIN_TYPE = "bridge"
TARGET = "pycni_plugins.bridge:BridgePlugin"
TARGETS = {"bridge": TARGET, "host-local": "pycni_plugins.host_local:HostLocalPlugin"}  # every built-in type
SOCKET = "/run/pycni/pycni.sock"  # PYCNI_SOCKET overrides it
FALLBACK_PATH: list[str] = []
UNAVAILABLE = b'{\n    "code": 11,\n    "msg": "pycni daemon required (PYCNI_DAEMON=required) but unreachable"\n}'
# --- shim body ---
import _socket  # noqa: E402 (the constants above are the installer's)
import fcntl  # noqa: E402
import posix  # noqa: E402
import sys  # noqa: E402

_MAX_FDS = 16  # the daemon's cap (daemon.MAX_FDS)


def _u32(n: int) -> bytes:
    return n.to_bytes(4, "little")


def _at(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 4], "little")


def _local(stdin: bytes) -> None:
    sys.path += [p for p in FALLBACK_PATH if p not in sys.path]  # after the standard library
    from pycni.sdk.skel import main

    main(PLUGIN_TYPE, TARGET, stdin, TARGETS)


def _emit(status: int, out: bytes, err: bytes = b"") -> None:
    for fd, data in ((1, out), (2, err)):
        while data:
            data = data[posix.write(fd, data) :]
    posix._exit(status)


def _without_daemon(stdin: bytes, required: bool, path: bytes, reason: str) -> None:
    if required:
        _emit(1, UNAVAILABLE, b"pycni shim: " + path + b": " + reason.encode() + b"\n")
    _local(stdin)


def _unsafe(path: bytes) -> str:
    """Why another uid could put its own socket at ``path`` ("" if none could), as the daemon
    judges its socket directory: each directory on the way owned by root or us, and none but a
    sticky one (as /tmp) above the last writable by group or others. A directory reached through
    a symlink is judged as its target, not its target's ancestors (the daemon checked those)."""
    if path[:1] != b"/":
        return "the socket path is not absolute"
    euid = posix.geteuid()
    parts = path.split(b"/")[:-1]
    for i in range(1, len(parts) + 1):
        directory = b"/".join(parts[:i]) or b"/"
        try:
            st = posix.stat(directory)
        except OSError:
            return ""  # connecting fails, and says why
        if st.st_uid not in (0, euid):
            return f"{directory.decode(errors='replace')} is owned by uid {st.st_uid}, neither root nor {euid}"
        if st.st_mode & 0o022 and (i == len(parts) or not st.st_mode & 0o1000):
            return f"{directory.decode(errors='replace')} is writable by group or others"
    return ""


def _read_stdin() -> bytes:
    chunks = []
    while chunk := posix.read(0, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _inherited() -> list[int]:
    fds: list[int] = []
    for name in posix.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                posix.fstat(fd)  # the listing's own fd is closed by now
            except OSError:
                continue
            fds.append(fd)
    return fds


def _open_netns(path: bytes) -> tuple[int, int]:
    """``(fd, 0)`` for a network namespace, ``(-1, errno)`` when it cannot be opened, ``(-1, 0)``
    when it is something else (the plugin run here says what is wrong with it)."""
    try:
        fd = posix.open(path, posix.O_RDONLY | posix.O_NONBLOCK | posix.O_CLOEXEC)
    except OSError as e:
        return -1, e.errno or 0
    try:
        if fcntl.ioctl(fd, 0xB703) == 0x40000000:  # NS_GET_NSTYPE == CLONE_NEWNET
            return fd, 0
    except OSError:
        pass  # not an nsfs file
    posix.close(fd)
    return -1, 0


def _result(answer: bytes) -> None:
    """Reproduce a complete ``R`` frame (returns if ``answer`` is not one)."""
    if answer[:1] == b"R" and len(answer) >= 13 and len(answer) == 13 + _at(answer, 5) + _at(answer, 9):
        n_out = _at(answer, 5)
        _emit(_at(answer, 1), answer[13 : 13 + n_out], answer[13 + n_out :])


def _main() -> None:
    environ = posix.environ
    mode = environ.get(b"PYCNI_DAEMON", b"")
    stdin = _read_stdin()
    if mode == b"off":
        _local(stdin)
    required = mode == b"required"
    path = environ.get(b"PYCNI_SOCKET") or SOCKET.encode()
    unsafe = _unsafe(path)
    if unsafe:
        _without_daemon(stdin, required, path, "another user could replace the socket: " + unsafe)
    fds = _inherited()
    if len(fds) > _MAX_FDS - 3:  # the daemon could not hold them all (the runtime's locks)
        _without_daemon(stdin, required, path, f"{len(fds)} inherited fds, more than the daemon takes")
    ctr_fd, ctr_errno = -1, 0
    if environ.get(b"CNI_NETNS"):
        ctr_fd, ctr_errno = _open_netns(environ[b"CNI_NETNS"])
        if ctr_fd < 0 and not ctr_errno:
            _without_daemon(stdin, required, path, "CNI_NETNS is not a network namespace")
    own = posix.open("/proc/thread-self/ns/net", posix.O_RDONLY | posix.O_CLOEXEC)
    try:
        cwd = posix.open(".", posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
    except OSError as e:
        _without_daemon(stdin, required, path, "cannot open the working directory: " + (e.strerror or str(e)))
    fds[:0] = [own, cwd, ctr_fd] if ctr_fd >= 0 else [own, cwd]
    env = b"\0".join(k + b"=" + v for k, v in environ.items() if k.startswith((b"CNI_", b"PYCNI_")))
    kind = PLUGIN_TYPE.encode()
    head = b"PYCNI\x02" + _u32(len(kind)) + _u32(len(env)) + _u32(len(stdin)) + _u32(ctr_fd >= 0) + _u32(ctr_errno)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.connect(path)
    except OSError as e:
        _without_daemon(stdin, required, path, e.strerror or str(e))
    # Whoever listens gets our namespaces and lock fds and writes our result: only root or us.
    peer_uid = int.from_bytes(sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)[4:8], sys.byteorder)
    if peer_uid not in (0, posix.geteuid()):
        _without_daemon(stdin, required, path, f"its listener runs as uid {peer_uid}, neither root nor ours")
    try:
        data = memoryview(head + kind + env + stdin)
        rights = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
        data = data[sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)]) :]
        while data:
            data = data[sock.send(data) :]
    except OSError:
        pass  # the daemon hung up early (busy, or told us to run it here): its answer decides
    for fd in fds:
        posix.close(fd)
    chunks = []
    try:
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
    except OSError:
        pass  # the daemon died: what was received so far decides
    answer = b"".join(chunks)
    if answer[:1] == b"A" and len(answer) >= 10:
        on_loss, status, size = answer[1], _at(answer, 2), _at(answer, 6)
        _result(answer[10 + size :])
        if on_loss == 1:
            _emit(status, answer[10 : 10 + size], b"pycni shim: the daemon went away during the request\n")
        _without_daemon(stdin, required, path, "the daemon went away during the request")
    _result(answer)
    if answer[:1] == b"F":
        reason = "the daemon asked for the plugin to run here: " + answer[1:].decode(errors="replace")
    else:
        reason = "no answer from the daemon"
    _without_daemon(stdin, required, path, reason)


if __name__ == "__main__":
    _main()
