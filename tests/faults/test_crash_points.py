"""A crash at every step: the process running ADD or DEL is SIGKILLed at each failpoint of the
runtime and of the in-process plugins, between one kernel operation and the next. Whatever was
half-done, a later DEL converges, and so does ``reconcile`` once the container's namespace is
gone: no veth, no lease, no nftables element, no state record, no cache file. Afterwards a fresh
ADD of the same container works (CHECK passes, it answers ping).

The same failpoints with ``raise`` (a failing kernel call instead of a crash) prove that ADD
with rollback leaves nothing behind, whichever step fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pycni import failpoints
from pycni.errors import CNIError
from tests.faults.conftest import REPO

pytestmark = pytest.mark.privileged

#: Every failpoint of ADD, in the order the full chain reaches them.
ADD_FAILPOINTS = [
    "runtime.add.before-plugin@1",  # nothing done yet
    "runtime.add.before-plugin@2",  # loopback done
    "bridge.add.after-bridge",
    "bridge.add.after-record",
    "bridge.add.after-veth",
    "nft.apply.spoofchk.after-record",
    "bridge.add.after-spoofchk",
    "host-local.add.after-lease",
    "bridge.add.after-ipam",
    "bridge.add.after-container",
    "bridge.add.after-gateway",
    "nft.apply.masq.after-record",
    "bridge.add.after-masq",
    "runtime.add.before-plugin@3",  # bridge done
    "firewall.add.after-ensure",
    "nft.apply.firewall.after-record",
    "runtime.add.before-plugin@4",  # firewall done
    "nft.apply.portmap.after-record",
    "portmap.add.after-nft",
    "runtime.add.before-cache-write",  # every plugin done, nothing cached
]
#: Every failpoint of DEL (plugins in reverse order).
DEL_FAILPOINTS = [
    "runtime.del.before-plugin@1",
    "nft.release.portmap.after-commit",
    "runtime.del.before-plugin@2",
    "nft.release.firewall.after-commit",
    "runtime.del.before-plugin@3",
    "bridge.del.after-link",
    "nft.release.spoofchk.after-commit",
    "nft.release.masq.after-commit",
    "bridge.del.after-nft",
    "host-local.del.before-release",
    "bridge.del.after-ipam",
    "runtime.del.before-plugin@4",
    "runtime.del.before-cache-delete",
]
_CALL = re.compile(r'failpoint\(f?"([^"]+)"\)')
_OWNERS = ("masq", "spoofchk", "portmap", "firewall")


def test_every_failpoint_in_the_code_is_crashed_at():
    """A failpoint added to the code without a crash test here fails this test."""
    found = set()
    for path in [*Path(REPO, "pycni").rglob("*.py"), *Path(REPO, "pycni_plugins").rglob("*.py")]:
        for name in _CALL.findall(path.read_text()):
            found |= {name.replace("{owner}", o) for o in _OWNERS} if "{owner}" in name else {name}
    tested = {f.split("@")[0] for f in ADD_FAILPOINTS + DEL_FAILPOINTS}
    assert found == tested


def _crash(world, op: str, cid: str, ns, point: str) -> None:
    name, _, nth = point.partition("@")
    code, out, err = world.run(op, cid, ns.path, failpoints=f"{name}=kill@{nth or 1}")
    assert code == -9, f"{op} was not killed at {point} (exit {code}): {out} {err[-2000:]}"
    assert world.reached()[-1][0] == name


def _recover_and_reuse(world, ns, recovery):
    """Recover from the crash by a DEL, or by a reconcile after the container's namespace went;
    then nothing is left and the same container ID attaches and works again."""
    if recovery == "del":
        world.delete("victim", ns.path)
        assert world.leftovers(ns) == {}
        world.delete("victim", ns.path)  # and again: DEL stays idempotent
    else:
        ns.__exit__(None, None, None)
        report = world.reconcile()
        assert report.errors == (), report
        assert world.leftovers() == {}, report
        ns = world.make_netns("c")
    world.works("victim", ns)
    world.delete("victim", ns.path)
    assert world.leftovers(ns) == {}


@pytest.mark.parametrize("recovery", ["del", "reconcile"])
@pytest.mark.parametrize("point", ADD_FAILPOINTS)
def test_add_killed_at(world, point, recovery):
    ns = world.make_netns("c")
    _crash(world, "add", "victim", ns, point)
    _recover_and_reuse(world, ns, recovery)


@pytest.mark.parametrize("recovery", ["del", "reconcile"])
@pytest.mark.parametrize("point", DEL_FAILPOINTS)
def test_del_killed_at(world, point, recovery):
    ns = world.make_netns("c")
    world.works("victim", ns)
    _crash(world, "del", "victim", ns, point)
    _recover_and_reuse(world, ns, recovery)


@pytest.fixture
def raising(monkeypatch):
    def arm(point: str) -> None:
        name, _, nth = point.partition("@")
        monkeypatch.setenv("PYCNI_FAILPOINTS", f"{name}=raise@{nth or 1}")
        failpoints.reload()

    yield arm
    monkeypatch.delenv("PYCNI_FAILPOINTS", raising=False)
    failpoints.reload()


@pytest.mark.parametrize("point", [p for p in ADD_FAILPOINTS if not p.startswith("runtime.")])
def test_add_with_rollback_failing_at_any_step_leaves_nothing(world, raising, point):
    ns = world.make_netns("c")
    raising(point)
    with pytest.raises(CNIError, match=f"injected fault at {point.split('@')[0]}"):
        world.runtime.add_network_list(world.network, world.rt("victim", ns.path), rollback=True)
    raising("none")
    assert world.leftovers(ns) == {}
    world.works("victim", ns)
