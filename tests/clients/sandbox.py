"""A throwaway host for real CNI clients: a network namespace and a private mount namespace.

podman, containerd and ctr run as root and use fixed paths (``/etc/cni/net.d``, ``/opt/cni/bin``,
``/var/lib/cni``, ``/run``, ``/var/lib/containers``, ``/var/tmp``, ``/dev/shm``). A "holder"
process sits in the throwaway host network namespace and in a private mount namespace where
fresh tmpfs cover those trees and the test's own directories are bound where the clients look;
every client command is started in both namespaces with ``nsenter``. So the bridge, veths and
nft tables appear only in the throwaway namespace, and every file a client writes is a temp file.
The exception is cgroupfs, which is global: containers get a cgroup parent unique to the
sandbox, removed at close.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from pycni import netns
from tests.helpers import kernel

__all__ = ["Sandbox", "Interactive", "SandboxError"]

# Run by the holder: $1 = sandbox dir, $2 = plugin dir. Reading stdin keeps it (and so the mount
# namespace) alive until the test closes the pipe, or dies.
_HOLDER = r"""
set -eu
# a sysfs of the throwaway host's own (its interfaces), with the cgroup hierarchies carried over
mount --rbind /sys/fs/cgroup "$1/cgroup"
mount -t sysfs sysfs /sys
mount --move "$1/cgroup" /sys/fs/cgroup
# the clients' fixed paths: empty, private, gone with the namespace
for d in /run /var/lib /opt /etc/cni; do mount -t tmpfs -o mode=0755 pycni-clients "$d"; done
for d in /var/tmp /dev/shm; do mount -t tmpfs -o mode=1777 pycni-clients "$d"; done
mkdir -p /etc/cni/net.d /opt/cni/bin /var/lib/cni /run/pycni /run/netns
mount --bind "$1/etc-cni-net.d" /etc/cni/net.d
mount --bind "$2" /opt/cni/bin
mount --bind "$1/var-lib-cni" /var/lib/cni
mount --bind "$1/run-pycni" /run/pycni
mount --bind "$1/run-netns" /run/netns
echo ready
read -r _ || true
"""

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SandboxError(AssertionError):
    """The sandbox could not be set up, or a command in it failed."""


def _mnt_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:  # gone, or a kernel thread
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _cgroup_roots() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers and the v2 one)."""
    roots = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        if fstype in ("cgroup", "cgroup2"):
            roots.append(Path(fields[4]))
    return roots


class Interactive:
    """A client command whose container waits on stdin: read its output up to a marker, look at
    the running container, then close stdin to let it end."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.output = b""

    def wait_for(self, marker: str, timeout: float = 60.0) -> str:
        """Output so far, once ``marker`` is on a line of its own."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while f"\n{marker}\n" not in "\n" + self.output.decode(errors="replace"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.proc.kill()
                raise SandboxError(f"no {marker!r} within {timeout}s; output: {self.text()!r}")
            chunk = os.read(fd, 65536)
            if not chunk:
                self.proc.wait()
                raise SandboxError(f"exited {self.proc.returncode} before {marker!r}; output: {self.text()!r}")
            self.output += chunk
        return self.output.decode(errors="replace")

    def finish(self, timeout: float = 60.0) -> int:
        """Close stdin (the container's ``read`` ends) and wait for the client to exit."""
        try:
            rest, _ = self.proc.communicate(timeout=timeout)  # closes stdin first
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise SandboxError(f"client still running {timeout}s after stdin closed: {self.text()!r}") from None
        self.output += rest or b""
        return self.proc.returncode

    def text(self) -> str:
        return self.output.decode(errors="replace")


class Sandbox:
    """The throwaway host: ``host`` netns + a private mount namespace (see the module doc).

    On the test's side: ``conf_dir`` is ``/etc/cni/net.d``, ``cni_dir`` is ``/var/lib/cni``
    (results cache, host-local leases), ``state_dir`` is ``/run/pycni``, ``netns_dir`` is
    ``/run/netns`` and ``plugin_dir`` is ``/opt/cni/bin`` inside.
    """

    def __init__(self, host: netns.Throwaway, root: Path, plugin_dir: Path, name: str) -> None:
        self.host = host
        self.root = root
        self.plugin_dir = plugin_dir
        self.name = name  # also the containers' cgroup parent
        self.conf_dir = root / "etc-cni-net.d"
        self.cni_dir = root / "var-lib-cni"
        self.state_dir = root / "run-pycni"
        self.netns_dir = root / "run-netns"
        self.home = root / "home"
        self._holder: subprocess.Popen[bytes] | None = None
        self._services: list[subprocess.Popen[bytes]] = []
        self._baseline_mounts: set[str] = set()
        self.client_env: dict[str, str] = {}  # added to every client's environment

    # -- life cycle ----------------------------------------------------------------------------

    def __enter__(self) -> Sandbox:
        for d in (self.conf_dir, self.cni_dir, self.state_dir, self.netns_dir, self.home, self.root / "cgroup"):
            d.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)  # as pycni makes /run/pycni (the daemon insists on it)
        argv = ["nsenter", f"--net={self.host.path}", "--", "unshare", "--mount", "--propagation", "private"]
        argv += ["--", "sh", "-c", _HOLDER, "holder", str(self.root), str(self.plugin_dir)]
        self._holder = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self._holder.stdout is not None
        line = self._holder.stdout.readline()
        if line != b"ready\n":
            self._holder.kill()
            _, err = self._holder.communicate()
            raise SandboxError(f"sandbox holder failed: {line!r} {err.decode(errors='replace')}")
        self._baseline_mounts = self.mounts()
        return self

    def __exit__(self, *exc: object) -> None:
        problems = self.close()
        if problems and exc[0] is None:
            raise SandboxError("sandbox teardown: " + "; ".join(problems))

    def close(self) -> list[str]:
        """Stop services, kill (and report) any other process left in the sandbox, end the holder,
        remove the cgroup parent (reporting cgroups that still held processes)."""
        problems = []
        for proc in reversed(self._services):
            self._stop(proc)
        self._services.clear()
        for pid, cmd in self.processes().items():
            problems.append(f"process left: {pid} {cmd}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self._holder is not None:
            try:
                self._holder.communicate(timeout=10)  # EOF on its stdin ends it
            except subprocess.TimeoutExpired:
                self._holder.kill()
                self._holder.communicate()
            self._holder = None
        problems += self._remove_cgroups()
        return problems

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _remove_cgroups(self) -> list[str]:
        problems = []
        for root in _cgroup_roots():
            top = root / self.name
            if not top.is_dir():
                continue
            tree = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
            for d in [*tree, top]:
                for attempt in range(50):  # a killed process leaves its cgroup a moment later
                    with contextlib.suppress(OSError):
                        pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
                        if pids and attempt == 0:
                            problems.append(f"processes left in cgroup {d}: {[_cmdline(p) for p in pids]}")
                        for pid in pids:
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGKILL)
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.1)
            if top.exists():
                problems.append(f"cgroup {top} could not be removed")
        return problems

    # -- running things inside -----------------------------------------------------------------

    @property
    def holder_pid(self) -> int:
        assert self._holder is not None, "sandbox not entered"
        return self._holder.pid

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment for a client (nothing of the test's leaks in) plus ``client_env``."""
        return {"PATH": _PATH, "HOME": str(self.home), "LANG": "C.UTF-8", **self.client_env, **extra}

    def command(self, argv: list[str]) -> list[str]:
        return ["nsenter", f"--target={self.holder_pid}", "--mount", "--net", f"--wd={self.home}", "--", *argv]

    def run(self, argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 60.0) -> str:
        """Run a command inside; its stdout, or :class:`SandboxError` with both streams."""
        try:
            done = subprocess.run(
                self.command(argv), env=env or self.env(), capture_output=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as e:
            raise SandboxError(f"{argv} timed out after {timeout}s: {e.stdout!r} {e.stderr!r}") from None
        if done.returncode != 0:
            raise SandboxError(
                f"{argv} exited {done.returncode}:\n{done.stdout.decode(errors='replace')}"
                f"\n{done.stderr.decode(errors='replace')}"
            )
        return done.stdout.decode()

    def interactive(self, argv: list[str], *, env: dict[str, str] | None = None) -> Interactive:
        """Start a client command with stdin and stdout as pipes (stderr joins stdout)."""
        proc = subprocess.Popen(
            self.command(argv),
            env=env or self.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        return Interactive(proc)

    def service(self, argv: list[str], log: Path, *, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start a long-running process inside (containerd; the daemon variants' ``pycni serve``),
        stopped with SIGTERM at close if the test has not stopped it."""
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                self.command(argv), env=env or self.env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        self._services.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> int:
        """SIGTERM a service and wait for it; its exit status."""
        self._stop(proc)
        self._services.remove(proc)
        return proc.returncode

    # -- what is there -------------------------------------------------------------------------

    def processes(self) -> dict[int, str]:
        """Processes in the sandbox's mount namespace other than the holder and the services."""
        ours = _mnt_ns(self.holder_pid)
        skip = {self.holder_pid} | {p.pid for p in self._services}
        out = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in skip and _mnt_ns(int(entry)) == ours:
                out[int(entry)] = _cmdline(int(entry))
        return out

    def mounts(self) -> set[str]:
        """Mount points in the sandbox's mount namespace."""
        lines = Path(f"/proc/{self.holder_pid}/mountinfo").read_text().splitlines()
        return {line.split()[4] for line in lines}

    def leases(self) -> dict[str, str]:
        """ip -> owner (``cid/ifname``) of every host-local lease under ``/var/lib/cni/networks``."""
        out = {}
        for f in self.cni_dir.glob("networks/*/*"):
            try:
                ipaddress.ip_address(f.name)
            except ValueError:
                continue
            cid, _, ifname = f.read_bytes().decode().strip().partition("\r\n")
            out[f.name] = f"{cid}/{ifname}"
        return out

    def cached(self) -> list[str]:
        return sorted(f.name for f in self.cni_dir.glob("results/*"))

    def veths(self) -> list[str]:
        return sorted(name for name, link in kernel.links(self.host.path).items() if link["kind"] == "veth")

    def nft_attachments(self) -> list[str]:
        """Attachment keys holding pycni nft elements or records in the host namespace."""
        from pycni_plugins.kernel import nft

        groups = netns.run_in(self.host.path, nft.attachments, str(self.state_dir))
        return sorted(k for k, g in groups.items() if g["elements"] or g["record"])

    def records(self) -> list[str]:
        """pycni state records (other than the nft epoch)."""
        found = [f"{f.parent.name}/{f.name}" for f in self.state_dir.glob("*/*") if not f.name.startswith(".")]
        return sorted(r for r in found if r != "nft/epoch")

    def leftovers(self) -> dict[str, Any]:
        """What any container left behind (empty once every container is gone and cleaned up)."""
        left = {
            "veths": self.veths(),
            "leases": self.leases(),
            "cache": self.cached(),
            "nft": self.nft_attachments(),
            "records": self.records(),
            "netns": sorted(os.listdir(self.netns_dir)),
            "mounts": sorted(self.mounts() - self._baseline_mounts),
            "processes": self.processes(),
        }
        return {k: v for k, v in left.items() if v}
