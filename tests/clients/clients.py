"""Drivers for the real CNI clients, each running inside a :class:`~tests.clients.sandbox.Sandbox`.

podman (libcni) reads a containers.conf pointed at by ``CONTAINERS_CONF``: CNI backend, the
plugin dir under test, a temp config dir; its storage is a temp dir (vfs driver: nothing to
mount), its run and tmp dirs are on the sandbox's private ``/run`` tmpfs. containerd gets its
own root and state (temp dirs) and socket (on the private ``/run``); ``ctr run --cni`` (go-cni)
finds the conflist in ``/etc/cni/net.d`` and the plugins in ``/opt/cni/bin``, which the sandbox
binds to the test's dirs. Containers are busybox with a cgroup parent unique to the sandbox.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .sandbox import Interactive, Sandbox, SandboxError

__all__ = ["IMAGE", "Podman", "Containerd", "container_script"]

IMAGE = "localhost/pycni-busybox:test"


def container_script(gateway: str) -> str:
    """Print eth0's IPv4 address and whether the gateway answers a ping, then wait for stdin
    to close (the test looks at the running container meanwhile)."""
    return (
        "ip -4 -o addr show dev eth0; "
        f"if ping -c 1 -W 5 {gateway} >/dev/null; then echo PING-OK; else echo PING-FAILED; fi; "
        "echo READY; read -r _ || true"
    )


# podman's default ulimits are above this machine's hard limits and runc cannot raise them
# (no CAP_SYS_RESOURCE here); busybox needs little.
_ULIMITS = ["nofile=1024:1024", "nproc=4096:4096"]


class Podman:
    def __init__(self, sandbox: Sandbox, default_subnet: str = "198.18.99.0/24") -> None:
        self.sandbox = sandbox
        self.dir = sandbox.root / "podman"
        self.dir.mkdir()
        self.conf = self.dir / "containers.conf"
        self.conf.write_text(
            "[containers]\n"
            f"default_ulimits = {json.dumps(_ULIMITS)}\n"
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "none"\n'
            'runtime = "runc"\n'
            "[network]\n"
            'network_backend = "cni"\n'
            f"cni_plugin_dirs = [{json.dumps(str(sandbox.plugin_dir))}]\n"
            f"network_config_dir = {json.dumps(str(sandbox.conf_dir))}\n"
            f"default_subnet = {json.dumps(default_subnet)}\n"
        )
        # conmon, and the `podman container cleanup` it runs when a container exits, inherit this.
        self.env = sandbox.env(CONTAINERS_CONF=str(self.conf))

    def argv(self, *args: str) -> list[str]:
        d = self.dir
        return [
            "podman",
            # run root and tmp dir on the sandbox's private /run (podman caps the run root at 50 chars)
            *("--root", str(d / "root"), "--runroot", "/run/podman/runroot", "--tmpdir", "/run/podman/tmp"),
            *("--storage-driver", "vfs"),
            *args,
        ]

    def __call__(self, *args: str, timeout: float = 60.0) -> str:
        return self.sandbox.run(self.argv(*args), env=self.env, timeout=timeout)

    def load(self, archive: Path) -> None:
        self("load", "--quiet", "--input", str(archive))

    def run(self, name: str, network: str, script: str) -> Interactive:
        """``podman run --rm -i``: the container lives until its stdin closes."""
        argv = self.argv("run", "--rm", "-i", "--name", name, "--network", network, "--cap-add", "NET_RAW")
        argv += ["--cgroup-parent", f"/{self.sandbox.name}", IMAGE, "sh", "-c", script]
        return self.sandbox.interactive(argv, env=self.env)

    def containers(self) -> list[str]:
        return self("ps", "--all", "--quiet", "--no-trunc").split()


class Containerd:
    """containerd for one sandbox: started by :meth:`start`, stopped by :meth:`stop`."""

    NAMESPACE = "pycni-test"

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.dir = sandbox.root / "containerd"
        self.dir.mkdir()
        # On the sandbox's private /run: a temp dir's path can exceed a socket path's 104 bytes.
        self.socket = "/run/containerd/containerd.sock"
        self.log = self.dir / "containerd.log"
        self.config = self.dir / "config.toml"
        # Only what ctr needs: no CRI (it would start its own CNI handling), no tracing.
        disabled = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.tracing"]
        disabled += [f"io.containerd.snapshotter.v1.{s}" for s in ("aufs", "btrfs", "zfs", "devmapper")]
        self.config.write_text(
            "version = 2\n"
            f"root = {json.dumps(str(self.dir / 'root'))}\n"
            f"state = {json.dumps(str(self.dir / 'state'))}\n"
            f"disabled_plugins = {json.dumps(disabled)}\n"
            f"[grpc]\n  address = {json.dumps(self.socket)}\n"
            f"[ttrpc]\n  address = {json.dumps(self.socket + '.ttrpc')}\n"
        )
        self._proc = None

    def start(self, timeout: float = 30.0) -> None:
        self._proc = self.sandbox.service(["containerd", "--config", str(self.config)], self.log)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.ctr("version", timeout=5)
                return
            except SandboxError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise SandboxError(f"containerd did not start: {self.log.read_text()[-2000:]}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        assert self._proc is not None
        status = self.sandbox.stop(self._proc)
        self._proc = None
        if status != 0:
            raise SandboxError(f"containerd exited {status}: {self.log.read_text()[-2000:]}")

    def ctr(self, *args: str, timeout: float = 60.0) -> str:
        return self.sandbox.run(self.argv(*args), timeout=timeout)

    def argv(self, *args: str) -> list[str]:
        return ["ctr", "--address", self.socket, "--namespace", self.NAMESPACE, *args]

    def load(self, archive: Path) -> None:
        self.ctr("image", "import", "--snapshotter", "native", str(archive))

    def run(self, name: str, script: str) -> Interactive:
        """``ctr run --rm --cni``: go-cni sets the network up for the task, and tears it down when
        the container ends (stdin closed)."""
        argv = self.argv("run", "--rm", "--cni", "--snapshotter", "native", "--cgroup", f"/{self.sandbox.name}/{name}")
        argv += [IMAGE, name, "sh", "-c", script]
        return self.sandbox.interactive(argv)

    def containers(self) -> list[str]:
        return self.ctr("containers", "list", "--quiet").split()

    def tasks(self) -> list[str]:
        return [line.split()[0] for line in self.ctr("tasks", "list").splitlines()[1:] if line.strip()]
