"""Host profiles: the firewall a real host already has, built inside a throwaway "host" namespace.

A :class:`HostProfile` builds its ruleset in the namespace it is given (never the machine's own:
every nft call runs in a thread that entered it, every iptables tool under ``nsenter --net``),
takes it down again, and snapshots it (:meth:`HostProfile.ruleset`) so a test can prove that
pycni changed nothing of the host's own filtering. The profiles are shared by every host-firewall
test (the judge now; the iptables-compat and firewalld backends later).

* ``plain``: no firewall at all.
* ``hardened``: an admin's ``table inet filter`` whose forward chain has policy drop (replies of
  established connections accepted), as a hardened Debian ``/etc/nftables.conf`` has it.
* ``hardened+admin``: the same with the one rule the README tells the admin to add for the bridge.
* ``docker-nft`` / ``docker-legacy``: Docker 20.10's ruleset exactly as dockerd writes it
  (``iptables-save`` text: FORWARD policy DROP, DOCKER-USER, DOCKER-ISOLATION-STAGE-1/2, DOCKER,
  nat MASQUERADE for 172.17.0.0/16 off ``docker0``), a ``docker0`` bridge, and br_netfilter's
  ``bridge-nf-call-iptables``/``ip6tables`` = 1 (per namespace on this kernel), loaded through
  ``iptables-nft-restore`` and through ``iptables-legacy-restore``. Their drop is the one pycni's
  iptables compatibility step answers (``compat``): after ADD the containers get through.
* ``firewalld`` (:data:`FIREWALLD`, used by ``test_firewalld.py`` only): Debian's firewalld 1.3
  really running, with its own D-Bus system bus, in the host namespace and a private mount
  namespace (:mod:`.firewalld`), default zone public and no interface bound, so it rejects
  forwarded traffic; stopped by PID at teardown.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import attrs

from pycni import netns

#: Docker 20.10's ruleset on a host with only the default bridge, as ``iptables-save`` prints it.
DOCKER_20_10 = """\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:DOCKER - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
-A DOCKER -i docker0 -j RETURN
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:DOCKER - [0:0]
:DOCKER-ISOLATION-STAGE-1 - [0:0]
:DOCKER-ISOLATION-STAGE-2 - [0:0]
:DOCKER-USER - [0:0]
-A FORWARD -j DOCKER-USER
-A FORWARD -j DOCKER-ISOLATION-STAGE-1
-A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A FORWARD -o docker0 -j DOCKER
-A FORWARD -i docker0 ! -o docker0 -j ACCEPT
-A FORWARD -i docker0 -o docker0 -j ACCEPT
-A DOCKER-ISOLATION-STAGE-1 -i docker0 ! -o docker0 -j DOCKER-ISOLATION-STAGE-2
-A DOCKER-ISOLATION-STAGE-1 -j RETURN
-A DOCKER-ISOLATION-STAGE-2 -o docker0 -j DROP
-A DOCKER-ISOLATION-STAGE-2 -j RETURN
-A DOCKER-USER -j RETURN
COMMIT
"""

HARDENED = """\
table inet filter {
    chain input { type filter hook input priority filter; policy accept; }
    chain forward {
        type filter hook forward priority filter; policy drop;
        ct state established,related accept
    }
    chain output { type filter hook output priority filter; policy accept; }
}
"""


def hardened_admin(bridge: str) -> str:
    """:data:`HARDENED` plus the README's admin rule for ``bridge``."""
    q = f'"{bridge}"'
    extra = f"iifname {q} accept\n        oifname {q} ct state established,related accept\n"
    extra += f"        oifname {q} ct status dnat accept\n"
    return HARDENED.replace(
        "ct state established,related accept\n", f"ct state established,related accept\n        {extra}"
    )


def nft(path: str, text: str) -> str:
    """Run nft commands (``text``) through libnftables inside namespace ``path``; its output."""

    def run() -> str:
        from pycni._libnftables import Nftables

        ctx = Nftables()
        ctx.set_stateless_output(True)
        rc, out, err = ctx.cmd(text)
        assert rc == 0, err
        return str(out)

    return netns.run_in(path, run)


def in_ns(path: str, *argv: str, stdin: str | None = None) -> str:
    """A host tool run inside namespace ``path`` (``nsenter --net``; the mount namespace is ours)."""
    done = subprocess.run(
        ["nsenter", f"--net={path}", *argv], input=stdin, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, f"{argv}: {done.stderr}"
    return done.stdout


def legacy_loaded(path: str) -> list[str]:
    """The legacy iptables tables loaded in namespace ``path`` (``/proc/net/ip_tables_names``)."""

    def read() -> list[str]:
        with open("/proc/thread-self/net/ip_tables_names") as f:
            return f.read().split()

    return netns.run_in(path, read)


_PYCNI_TABLE = re.compile(r"^table (inet|bridge) pycni \{$")


def ruleset(path: str) -> str:
    """The host's own firewall in namespace ``path``: ``nft list ruleset`` without pycni's tables
    and without counters, then legacy iptables' tables (``iptables-legacy-save``, counters and
    comments dropped) where they are loaded. Listing legacy tables loads none."""
    kept: list[str] = []
    skipping = False
    for line in nft(path, "list ruleset").splitlines():
        if line.startswith("table "):
            skipping = bool(_PYCNI_TABLE.match(line))
        if not skipping and not line.startswith("#"):
            kept.append(line)
        if line == "}":
            skipping = False
    if legacy_loaded(path):
        save = in_ns(path, "iptables-legacy-save")
        kept.append("# legacy")
        kept += [re.sub(r"\[\d+:\d+\]", "", ln) for ln in save.splitlines() if not ln.startswith("#")]
    return "\n".join(kept)


def _docker0(path: str, bridge_nf: bool) -> None:
    def make() -> None:
        from pyroute2 import IPRoute

        assert os.path.isdir("/proc/sys/net/bridge"), "br_netfilter's sysctls are not per namespace here"
        with IPRoute() as ipr:
            ipr.link("add", ifname="docker0", kind="bridge")
            index = ipr.link_lookup(ifname="docker0")[0]
            ipr.addr("add", index=index, address="172.17.0.1", prefixlen=16)
            ipr.link("set", index=index, state="up")
        if bridge_nf:
            for name in ("bridge-nf-call-iptables", "bridge-nf-call-ip6tables"):
                with open(f"/proc/sys/net/bridge/{name}", "w") as f:
                    f.write("1")

    netns.run_in(path, make)


def _drop_docker0(path: str) -> None:
    def drop() -> None:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            for index in ipr.link_lookup(ifname="docker0"):
                ipr.link("del", index=index)

    netns.run_in(path, drop)


@attrs.frozen
class HostProfile:
    """One kind of host firewall: ``build``/``teardown`` in a namespace path, and what the judge
    must name there (``drop_where``, a substring of the finding's message; ``None``: nothing)."""

    name: str
    build_fn: Callable[[str, str], None]
    teardown_fn: Callable[[str], None]
    drop_where: str | None
    #: Does the profile's forward filtering cut containers off (egress from the bridge)?
    drops_egress: bool
    #: Tools the profile needs on the machine.
    tools: tuple[str, ...] = ()
    #: Does pycni's iptables compatibility step (firewall plugin, :mod:`pycni_plugins.kernel.iptables`)
    #: put its accepts where the drop lives, so the containers get through after all?
    compat: bool = False

    def missing(self) -> str | None:
        for tool in self.tools:
            if shutil.which(tool) is None:
                return f"{tool} not installed"
        return None

    def build(self, path: str, bridge: str = "nomad") -> None:
        self.build_fn(path, bridge)

    def teardown(self, path: str) -> None:
        self.teardown_fn(path)

    def ruleset(self, path: str) -> str:
        return ruleset(path)


def _nothing(path: str, *_: Any) -> None:
    pass


def _hardened(path: str, bridge: str) -> None:
    nft(path, HARDENED)


def _hardened_fixed(path: str, bridge: str) -> None:
    nft(path, hardened_admin(bridge))


def _drop_inet_filter(path: str) -> None:
    nft(path, "delete table inet filter")


def _docker_nft(path: str, bridge: str) -> None:
    _docker0(path, bridge_nf=True)
    in_ns(path, "iptables-nft-restore", "-w", stdin=DOCKER_20_10)


def _undocker_nft(path: str) -> None:
    nft(path, "delete table ip filter\ndelete table ip nat")
    _drop_docker0(path)


def _docker_legacy(path: str, bridge: str) -> None:
    _docker0(path, bridge_nf=True)
    in_ns(path, "iptables-legacy-restore", "-w", stdin=DOCKER_20_10)


def _undocker_legacy(path: str) -> None:
    for table in ("filter", "nat"):
        in_ns(path, "iptables-legacy", "-w", "-t", table, "-F")
        in_ns(path, "iptables-legacy", "-w", "-t", table, "-X")
    in_ns(path, "iptables-legacy", "-w", "-P", "FORWARD", "ACCEPT")
    _drop_docker0(path)


PLAIN = HostProfile("plain", _nothing, _nothing, None, False)
HARDENED_INET = HostProfile(
    "hardened", _hardened, _drop_inet_filter, "table inet filter chain forward (policy drop)", True
)
HARDENED_FIXED = HostProfile("hardened+admin", _hardened_fixed, _drop_inet_filter, None, False)
DOCKER_NFT = HostProfile(
    "docker-nft",
    _docker_nft,
    _undocker_nft,
    "table ip filter chain FORWARD (policy drop)",
    True,
    ("iptables-nft-restore",),
    compat=True,
)
DOCKER_LEGACY = HostProfile(
    "docker-legacy",
    _docker_legacy,
    _undocker_legacy,
    "iptables-legacy table filter chain FORWARD (policy DROP)",
    True,
    ("iptables-legacy-restore", "iptables-legacy-save", "iptables-legacy"),
    compat=True,
)
PROFILES = (PLAIN, HARDENED_INET, HARDENED_FIXED, DOCKER_NFT, DOCKER_LEGACY)

#: The firewalld daemons running per host namespace path (:data:`FIREWALLD`).
FIREWALLDS: dict[str, Any] = {}


def _firewalld(path: str, bridge: str) -> None:
    """Debian's firewalld (zone public by default, no interface bound) with its own bus, in the
    host namespace and a private mount namespace (:mod:`.firewalld`); the test process (and the
    plugins it runs or execs) reaches that bus through ``DBUS_SYSTEM_BUS_ADDRESS``."""
    import tempfile

    from . import firewalld

    fw = firewalld.Firewalld(path, tempfile.mkdtemp(prefix="pycni-test-firewalld-"))
    FIREWALLDS[path] = fw
    try:
        fw.start()
    except BaseException:
        _unfirewalld(path)
        raise
    os.environ["DBUS_SYSTEM_BUS_ADDRESS"] = fw.address


def _unfirewalld(path: str) -> None:
    fw = FIREWALLDS.pop(path, None)
    if fw is None:
        return
    if os.environ.get("DBUS_SYSTEM_BUS_ADDRESS") == fw.address:
        del os.environ["DBUS_SYSTEM_BUS_ADDRESS"]
    fw.stop()
    shutil.rmtree(fw.work_dir, ignore_errors=True)


def _firewalld_missing() -> str | None:
    from . import firewalld

    return firewalld.missing()


#: firewalld 1.3 rejects forwarded traffic of interfaces in no zone; pycni's firewall plugin
#: makes the container addresses sources of zone ``trusted``, so egress passes.
FIREWALLD = HostProfile(
    "firewalld",
    _firewalld,
    _unfirewalld,
    "table inet firewalld chain filter_FWD_public",
    False,
    ("firewalld", "firewall-cmd", "dbus-daemon", "unshare", "nsenter"),
)
