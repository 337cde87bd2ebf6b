"""tuning: pycni (in-process and exec'd) against Debian's Go plugin on the same configs.

Known, asserted differences (see :mod:`pycni_plugins.tuning`): 1.1.1 has no ``txQLen`` and its
CHECK does not replace ``IFNAME`` in sysctl names (both fixed upstream); pycni
checks every sysctl and the link attributes before it changes anything and rolls back a failed
ADD, where the Go plugin leaves what it wrote; a ``..`` component is refused even when the
cleaned path stays below ``net/``.
"""

from __future__ import annotations

import pytest

from pycni_plugins.tuning import sysctl_path

from .twins import Twin, read_state, veth_into

pytestmark = [pytest.mark.privileged, pytest.mark.reference]

SYSCTLS = (
    "net/ipv4/conf/eth0/arp_ignore",
    "net/ipv4/conf/eth0/rp_filter",
    "net/ipv6/conf/eth0/accept_ra",
    "net/ipv4/tcp_syn_retries",
)
CTR_MAC = "02:00:00:00:aa:01"


def _conf(twin: Twin, version: str = "1.0.0", **extra) -> dict:
    prev = {
        "cniVersion": version,
        "interfaces": [{"name": "eth0", "mac": CTR_MAC, "sandbox": twin.ctr.path}],
        "ips": [{"address": "198.18.0.2/24", "interface": 0, **({"version": "4"} if version == "0.4.0" else {})}],
    }
    conf = {
        "cniVersion": version,
        "name": "tunenet",
        "type": "tuning",
        "dataDir": str(twin.root / "tuning-data"),
        "prevResult": prev,
    }
    conf.update(extra)
    return conf


def _result(twin: Twin, result: dict) -> dict:
    """The result normalised; 1.1.1 prints an empty ``"dns": {}`` that v1.9.1 (and pycni) omit."""
    out = twin.normalise(result)
    if out.get("dns") == {}:
        del out["dns"]
    return out


def _state(twin: Twin) -> dict:
    return read_state(twin.ctr.path, SYSCTLS)


def _prepared(twins: dict[str, Twin]) -> dict[str, Twin]:
    for twin in twins.values():
        veth_into(twin, ctr_mac=CTR_MAC)
    return twins


FULL = {
    "sysctl": {
        "net.ipv4.conf.IFNAME.arp_ignore": "1",
        "net/ipv4/conf/eth0/rp_filter": "2",
        "net.ipv4.tcp_syn_retries": "3",
    },
    "mac": "02:00:00:00:cc:02",
    "mtu": 1400,
    "promisc": True,
    "allmulti": True,
}


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0"])
def test_add_check_del_match_the_reference(twins, version):
    pair = _prepared(twins)
    seen = {}
    for impl, twin in pair.items():
        before = _state(twin)
        conf = _conf(twin, version, **FULL)
        result = twin.run("tuning", "ADD", conf)
        after = _state(twin)
        checked = twin.outcome("tuning", "CHECK", {**conf, "prevResult": result})
        twin.run("tuning", "DEL", conf)
        restored = _state(twin)
        twin.run("tuning", "DEL", conf)  # a second DEL finds nothing to restore
        seen[impl] = (_result(twin, result), after, restored["links"] == before["links"], before)
        # 1.1.1's CHECK does not replace IFNAME (fixed upstream since): it looks for the literal path
        bug = ("error", 999, "open /proc/sys/net/ipv4/conf/IFNAME/arp_ignore: no such file or directory")
        assert checked == (bug if impl == "go" else None), impl
    assert seen["inproc"] == seen["go"]
    assert seen["exec"] == seen["go"]
    result, after, restored, before = seen["go"]
    assert restored
    assert result["interfaces"][0]["mac"] == "02:00:00:00:cc:02"
    eth0 = after["links"]["eth0"]
    assert (eth0["mac"], eth0["mtu"], eth0["promisc"], eth0["allmulti"]) == ("02:00:00:00:cc:02", 1400, True, True)
    assert after["sysctls"]["net/ipv4/conf/eth0/arp_ignore"] == "1"
    assert after["sysctls"]["net/ipv4/tcp_syn_retries"] == "3"


def test_txqlen_is_set_and_restored_upstream_1_1_1_ignores_it(twins):
    pair = _prepared(twins)
    for impl, twin in pair.items():
        before = _state(twin)
        conf = _conf(twin, txQLen=321)
        twin.run("tuning", "ADD", conf)
        qlen = _state(twin)["links"]["eth0"]["txqlen"]
        twin.run("tuning", "DEL", conf)
        assert _state(twin)["links"] == before["links"], impl
        assert qlen == (before["links"]["eth0"]["txqlen"] if impl == "go" else 321), impl


@pytest.mark.parametrize(
    "how",
    [
        {"args": "MAC=02:00:00:00:dd:03"},
        {"runtimeConfig": {"mac": "02:00:00:00:dd:03"}},
        {"args.cni": {"mac": "02:00:00:00:dd:03", "mtu": 1300, "sysctl": {"net.ipv4.conf.eth0.arp_ignore": "2"}}},
    ],
    ids=["cni-args", "capability", "args-cni"],
)
def test_mac_from_args_capability_and_args_cni(twins, how):
    pair = _prepared(twins)
    seen = {}
    for impl, twin in pair.items():
        extra = {"mac": "02:00:00:00:cc:02", "mtu": 1400, "sysctl": {"net.ipv4.conf.eth0.arp_ignore": "1"}}
        env_args = how.get("args", "")
        if "runtimeConfig" in how:
            extra["runtimeConfig"] = how["runtimeConfig"]
        if "args.cni" in how:
            extra["args"] = {"cni": how["args.cni"]}
        conf = _conf(twin, **extra)
        result = twin.run("tuning", "ADD", conf, args=env_args)
        eth0 = _state(twin)
        twin.run("tuning", "CHECK", {**conf, "prevResult": result}, args=env_args)
        twin.run("tuning", "DEL", conf, args=env_args)
        seen[impl] = (_result(twin, result), eth0)
    assert seen["inproc"] == seen["exec"] == seen["go"]
    assert seen["go"][1]["links"]["eth0"]["mac"] == "02:00:00:00:dd:03"


def test_check_notices_a_changed_value(twins):
    pair = _prepared(twins)
    for impl, twin in pair.items():
        conf = _conf(twin, mtu=1400, sysctl={"net.ipv4.conf.eth0.arp_ignore": "1"})
        result = twin.run("tuning", "ADD", conf)
        checked = {**conf, "prevResult": result}
        outcome = twin.outcome("tuning", "CHECK", {**checked, "mtu": 1300})
        assert outcome == ("error", 999, "Error: Tuning configured MTU of eth0 is 1300, current value is 1400"), impl
        outcome = twin.outcome("tuning", "CHECK", {**checked, "sysctl": {"net.ipv4.conf.eth0.arp_ignore": "2"}})
        want = "Error: Tuning configured value of /proc/sys/net/ipv4/conf/eth0/arp_ignore is 2, current value is 1"
        assert outcome == ("error", 999, want), impl
        assert twin.outcome("tuning", "CHECK", {**checked, "promisc": True})[0] == "error", impl
        assert twin.outcome("tuning", "CHECK", {k: v for k, v in conf.items() if k != "prevResult"}) == (
            "error",
            999,
            "Required prevResult missing",
        ), impl
        twin.run("tuning", "DEL", conf)


# --- hostile configs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, message, go_message",
    [
        ("kernel.hostname", 'invalid net sysctl key: "kernel/hostname"', 'invalid net sysctl key: "kernel.hostname"'),
        ("/proc/sys/kernel/hostname", 'invalid net sysctl key: "/proc/sys/kernel/hostname"', None),
        ("net", 'invalid net sysctl key: "net"', None),
        # dots are separators: ".." becomes "//", so these name files below net/ that do not exist
        ("net/../kernel/hostname", "open /proc/sys/net/kernel/hostname: no such file or directory", None),
        (
            "net.IFNAME/../../kernel/hostname",
            "open /proc/sys/net/eth0/kernel/hostname: no such file or directory",
            None,
        ),
    ],
)
def test_sysctls_outside_net_are_refused_before_anything_changes(twins, key, message, go_message):
    pair = _prepared(twins)
    for impl, twin in pair.items():
        before = _state(twin)
        conf = _conf(twin, mtu=1300, sysctl={key: "x"})
        outcome = twin.outcome("tuning", "ADD", conf)
        assert outcome == ("error", 999, go_message or message if impl == "go" else message), impl
        assert _state(twin) == before, impl


def test_an_unknown_sysctl_fails_and_pycni_writes_none_of_the_others(twins):
    pair = _prepared(twins)
    for impl, twin in pair.items():
        before = _state(twin)
        sysctls = {"net.ipv4.conf.eth0.arp_ignore": "1", "net.ipv4.conf.eth0.no_such_knob": "1"}
        outcome = twin.outcome("tuning", "ADD", _conf(twin, sysctl=sysctls))
        assert outcome[0:2] == ("error", 999), impl
        assert "/proc/sys/net/ipv4/conf/eth0/no_such_knob" in outcome[2], impl
        assert "no such file or directory" in outcome[2], impl
        if impl != "go":  # Go writes in map order: arp_ignore may or may not have been written
            assert _state(twin) == before


def test_a_refused_mtu_rolls_back_sysctls_and_mac(twins):
    pair = _prepared(twins)
    for impl, twin in pair.items():
        before = _state(twin)
        conf = _conf(twin, mac="02:00:00:00:cc:02", mtu=70000, sysctl={"net.ipv4.conf.eth0.arp_ignore": "1"})
        outcome = twin.outcome("tuning", "ADD", conf)
        assert outcome[0:2] == ("error", 999), impl
        after = _state(twin)
        if impl == "go":  # what it wrote before the kernel refused the MTU stays
            assert after["links"]["eth0"]["mac"] == "02:00:00:00:cc:02"
            assert after["sysctls"]["net/ipv4/conf/eth0/arp_ignore"] == "1"
        else:
            assert after == before
            assert not list((twin.root / "tuning-data").rglob("c1_eth0")), "backup record left behind"


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"mac": "not-a-mac"}, "invalid args not-a-mac for MAC addr: address not-a-mac: invalid MAC address"),
        ({"sysctl": {"net.ipv4.conf.eth0.arp_ignore": 1}}, None),
        ({"mtu": "1400"}, None),
    ],
)
def test_bad_values_are_refused_and_nothing_changes(twins, extra, message):
    pair = _prepared(twins)
    for impl, twin in pair.items():
        before = _state(twin)
        conf = _conf(twin, **{"sysctl": {"net.ipv4.conf.eth0.rp_filter": "2"}, **extra})
        outcome = twin.outcome("tuning", "ADD", conf)
        assert outcome[0:2] == ("error", 999), impl
        if message:
            assert outcome[2] == message, impl
        else:
            assert outcome[2].startswith("failed to load netconf: json: cannot unmarshal"), impl
        if impl != "go" or "mac" not in extra:
            assert _state(twin) == before, impl


def test_del_of_a_gone_netns_succeeds_and_pycni_drops_its_record(twins):
    pair = _prepared(twins)
    for impl, twin in pair.items():
        conf = _conf(twin, mtu=1400)
        twin.run("tuning", "ADD", conf)
        assert twin.run("tuning", "DEL", conf, netns_path=str(twin.root / "gone")) is None, impl
        records = list((twin.root / "tuning-data").rglob("c1_eth0*"))
        assert records if impl == "go" else not records, impl  # Go leaves its backup file


def test_sysctl_path():
    assert sysctl_path("net.ipv4.conf.IFNAME.arp_ignore", "eth0.5") == "net/ipv4/conf/eth0.5/arp_ignore"
    assert sysctl_path("net//ipv4/./ip_forward", "x") == "net/ipv4/ip_forward"


def test_the_allowlist_refuses_unlisted_sysctls(twins, tmp_path, monkeypatch):
    from pycni_plugins import tuning

    allowlist = tmp_path / "allowlist.conf"
    allowlist.write_text("^net\\.ipv4\\.conf\\.IFNAME\\.[a-z_]+$\n\n")
    monkeypatch.setattr(tuning, "ALLOWLIST", str(allowlist))
    twin = twins["inproc"]
    veth_into(twin, ctr_mac=CTR_MAC)
    before = _state(twin)
    outcome = twin.outcome("tuning", "ADD", _conf(twin, sysctl={"net.ipv4.tcp_syn_retries": "3"}))
    want = (
        "Sysctl net.ipv4.tcp_syn_retries is not allowed. "
        "Only the following sysctls are allowed: [^net\\.ipv4\\.conf\\.IFNAME\\.[a-z_]+$]"
    )
    assert outcome == ("error", 999, want)
    assert _state(twin) == before
    twin.run("tuning", "ADD", _conf(twin, sysctl={"net.ipv4.conf.IFNAME.arp_ignore": "1"}))
    assert _state(twin)["sysctls"]["net/ipv4/conf/eth0/arp_ignore"] == "1"


def test_a_second_add_keeps_the_original_values_for_del(twins):
    for impl in ("inproc", "exec"):
        twin = twins[impl]
        veth_into(twin, ctr_mac=CTR_MAC)
        before = _state(twin)
        twin.run("tuning", "ADD", _conf(twin, mtu=1400, mac="02:00:00:00:cc:02"))
        twin.run("tuning", "ADD", _conf(twin, mtu=1300, mac="02:00:00:00:cc:03"))
        twin.run("tuning", "DEL", _conf(twin, mtu=1300))
        assert _state(twin)["links"] == before["links"], impl


# --- podman's default network ---------------------------------------------------------------------


def _podman_conflist(data_dir: str) -> bytes:
    """podman's 87-podman-bridge.conflist, with the subnet and IPAM dataDir moved to test space,
    and the ``mac`` capability on tuning (as podman's ``--mac-address`` uses it)."""
    import json

    return json.dumps(
        {
            "cniVersion": "0.4.0",
            "name": "podman",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni-podman0",
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "ranges": [[{"subnet": "198.18.0.0/24", "gateway": "198.18.0.1"}]],
                        "dataDir": data_dir,
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
                {"type": "firewall"},
                {"type": "tuning", "capabilities": {"mac": True}},
            ],
        }
    ).encode()


@pytest.mark.parametrize("backend", ["inprocess", "exec"])
def test_podmans_default_conflist_runs_on_pycnis_plugins(make_netns, tmp_path, pycni_bindir, backend, monkeypatch):
    from pycni.config import conflist_from_bytes
    from pycni.runtime import Runtime
    from pycni.runtime_conf import RuntimeConf
    from pycni.testing import probes

    monkeypatch.setenv("PYCNI_STATE_DIR", str(tmp_path / "state"))
    host, ctr = make_netns("host"), make_netns("c")
    runtime = Runtime([pycni_bindir], cache_dir=str(tmp_path / "cache"), backend=backend, host_netns=host.path)
    network = conflist_from_bytes(_podman_conflist(str(tmp_path / "ipam")))
    caps = {"mac": "02:00:00:00:ee:05", "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}
    rt = RuntimeConf("podctr", ctr.path, "eth0", capability_args=caps)
    result = runtime.add_network_list(network, rt)
    eth0 = next(i for i in result.interfaces if i.name == "eth0")
    assert eth0.mac == "02:00:00:00:ee:05"
    assert read_state(ctr.path)["links"]["eth0"]["mac"] == "02:00:00:00:ee:05"
    runtime.check_network_list(network, rt)
    ip = str(result.ips[0].address.ip)
    with probes.TCPEchoServer(ctr.path, 80):
        assert probes.tcp_echo(host.path, "198.18.0.1", 8080)
    assert probes.ping(host.path, ip)
    runtime.delete_network_list(network, rt)
    assert read_state(ctr.path)["links"].keys() == {"lo"}
    assert not list((tmp_path / "state" / "tuning").glob("*"))
