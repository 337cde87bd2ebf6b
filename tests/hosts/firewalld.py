"""A real firewalld for a test: Debian's firewalld with its own D-Bus system bus, inside the
test's host network namespace *and* a private mount namespace, stopped by PID.

``nsenter --net=<host>`` then ``unshare --mount --propagation private`` gives the daemons a mount
namespace of their own, where tmpfs hides ``/run``, ``/var/log``, ``/var/lib/firewalld`` and
``/etc/firewalld`` (firewalld runs on its shipped defaults and writes nothing of the machine's).
Only ``/run/dbus`` is a bind of a directory of the test's (``<work_dir>/bus``), so the bus socket is
reachable from the test's own mount namespace at ``<work_dir>/bus/system_bus_socket``
(``DBUS_SYSTEM_BUS_ADDRESS``). ``dbus-daemon`` is the first process (``unshare`` execs it);
firewalld joins its namespaces (``nsenter --target``). Both are stopped by their PIDs; when the
last one exits the mount namespace and its tmpfs mounts go with it. Nothing runs in, or is
mounted in, the machine's own namespaces.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import IO

_MOUNT_AND_RUN_BUS = """\
set -e
mount -t tmpfs -o mode=0755 pycni-test /run
mkdir -p /run/dbus
mount --bind "$1" /run/dbus
for d in /var/log /var/lib/firewalld /etc/firewalld; do
    [ -d "$d" ] && mount -t tmpfs -o mode=0755 pycni-test "$d"
done
exec dbus-daemon --system --nofork --nopidfile --nosyslog
"""

TOOLS = ("firewalld", "firewall-cmd", "dbus-daemon", "unshare", "nsenter")


def missing() -> str | None:
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    try:
        import jeepney  # noqa: F401
    except ImportError:
        return "jeepney (python3-jeepney) not installed"
    return None


class Firewalld:
    """firewalld and its bus, running for one host namespace (:func:`running`)."""

    def __init__(self, host: str, work_dir: str) -> None:
        self.host = host
        self.work_dir = work_dir
        self.bus_dir = os.path.join(work_dir, "bus")
        self.socket = os.path.join(self.bus_dir, "system_bus_socket")
        self.address = f"unix:path={self.socket}"
        self.bus: subprocess.Popen[bytes] | None = None
        self.daemon: subprocess.Popen[bytes] | None = None
        self._logs: list[IO[bytes]] = []

    def _log(self, name: str) -> IO[bytes]:
        """A daemon's stderr: a file of the test's, never a pipe nobody drains."""
        f = open(os.path.join(self.work_dir, f"{name}.log"), "wb")
        self._logs.append(f)
        return f

    def log(self, name: str) -> str:
        with open(os.path.join(self.work_dir, f"{name}.log"), errors="replace") as f:
            return f.read()[-4000:]

    def start(self, timeout: float = 30.0) -> None:
        os.makedirs(self.bus_dir, mode=0o755, exist_ok=True)
        self.bus = subprocess.Popen(
            ["nsenter", f"--net={self.host}", "unshare", "--mount", "--propagation", "private", "--",
             "sh", "-c", _MOUNT_AND_RUN_BUS, "sh", self.bus_dir],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log("dbus-daemon"),
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.socket):
            if self.bus.poll() is not None:
                raise RuntimeError(f"dbus-daemon failed: {self.log('dbus-daemon')}")
            if time.monotonic() > deadline:
                raise RuntimeError("dbus-daemon did not come up")
            time.sleep(0.02)
        self.daemon = subprocess.Popen(
            ["nsenter", f"--target={self.bus.pid}", "--net", "--mount", "--",
             "firewalld", "--nofork", "--nopid"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log("firewalld"),
        )  # fmt: skip
        while self.state() != "RUNNING":
            if self.daemon.poll() is not None:
                raise RuntimeError(f"firewalld failed: {self.log('firewalld')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"firewalld did not come up: {self.log('firewalld')}")
            time.sleep(0.1)

    def state(self) -> str | None:
        """firewalld's ``state`` property over the bus (None: not on the bus yet)."""
        from jeepney import DBusAddress, MessageType, Properties
        from jeepney.io.blocking import open_dbus_connection

        try:
            with open_dbus_connection(self.address) as conn:
                addr = DBusAddress(
                    "/org/fedoraproject/FirewallD1",
                    bus_name="org.fedoraproject.FirewallD1",
                    interface="org.fedoraproject.FirewallD1",
                )
                reply = conn.send_and_get_reply(Properties(addr).get("state"), timeout=2)
        except (OSError, TimeoutError):
            return None
        if reply.header.message_type == MessageType.error:
            return None
        return str(reply.body[0][1])

    def cmd(self, *args: str) -> str:
        """``firewall-cmd`` inside firewalld's namespaces (its private bus)."""
        assert self.bus is not None
        done = subprocess.run(
            ["nsenter", f"--target={self.bus.pid}", "--net", "--mount", "--", "firewall-cmd", *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"firewall-cmd {args}: {done.stdout}{done.stderr}"
        return done.stdout

    def stop(self) -> None:
        for proc in (self.daemon, self.bus):
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for f in self._logs:
            f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)


@contextlib.contextmanager
def running(host: str, work_dir: str) -> Iterator[Firewalld]:
    fw = Firewalld(host, work_dir)
    try:
        fw.start()
        yield fw
    finally:
        fw.stop()
