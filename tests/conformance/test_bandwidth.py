"""bandwidth: pycni (in-process and exec'd) against Debian's Go plugin on the same configs, and a
measured transfer through the shaped veth.

Known, asserted differences (see :mod:`pycni_plugins.bandwidth`): pycni's DEL also removes the
tbf and ingress qdiscs it put on the host veth (the Go plugin removes only the ifb), pycni
refuses rates and bursts the kernel's 32-bit fields cannot hold, and pycni's ifb is named per
attachment, not per container (names are compared as ``IFB``).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

from pycni import netns

from .twins import Twin, read_state, veth_into

pytestmark = [pytest.mark.privileged, pytest.mark.reference]

HOST_IP, CTR_IP = "198.18.0.1", "198.18.0.2"
SHAPED = {"ingressRate": 4_000_000, "ingressBurst": 80_000, "egressRate": 2_000_000, "egressBurst": 40_000}


def _prepare(twin: Twin) -> None:
    veth_into(twin, host_name="hveth0")
    netns.run_in(twin.host.path, _address, "hveth0", HOST_IP)
    netns.run_in(twin.ctr.path, _address, "eth0", CTR_IP)


def _address(ifname: str, ip: str) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        ipr.addr("add", index=index, address=ip, prefixlen=24)
        ipr.link("set", index=index, state="up")


def _conf(twin: Twin, version: str = "1.0.0", **extra) -> dict:
    prev = {
        "cniVersion": version,
        "interfaces": [
            {"name": "hveth0", "mac": "02:00:00:00:bb:01"},
            {"name": "eth0", "mac": "02:00:00:00:aa:01", "sandbox": twin.ctr.path},
        ],
        "ips": [{"address": f"{CTR_IP}/24", "interface": 1, **({"version": "4"} if version == "0.4.0" else {})}],
    }
    return {"cniVersion": version, "name": "bwnet", "type": "bandwidth", "prevResult": prev, **extra}


def _tc_state(path: str) -> dict:
    """Qdiscs (tbf parameters included) and ingress filters of every link, links by name."""

    def body() -> dict:
        from pyroute2 import IPRoute

        out: dict = {}
        with IPRoute() as ipr:
            names = {link["index"]: link.get("ifname") for link in ipr.link("dump")}
            for index, name in names.items():
                entries = []
                for q in ipr.get_qdiscs(index):
                    if q["index"] != index or q.get("kind") in ("noqueue", "pfifo_fast", "noop", "fq_codel", "mq"):
                        continue
                    entry = f"{q.get('kind')} {q['handle']:x} parent {q['parent']:x}"
                    if q.get("kind") == "tbf":
                        p = q.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
                        entry += f" rate {p['rate']} limit {p['limit']} buffer {p['buffer']}"
                    entries.append(entry)
                    if q.get("kind") == "ingress":
                        for f in ipr.get_filters(index, parent=0xFFFF0000):
                            opts = f.get_attr("TCA_OPTIONS")
                            if opts is None or opts.get_attr("TCA_U32_ACT") is None:
                                continue
                            act = opts.get_attr("TCA_U32_ACT")["attrs"][0][1]
                            mirred = act.get_attr("TCA_ACT_OPTIONS").get_attr("TCA_MIRRED_PARMS")
                            entries.append(
                                f"filter u32 prio {f['info'] >> 16} classid {opts.get_attr('TCA_U32_CLASSID'):x} "
                                f"mirred {mirred['eaction']} {mirred['action']} to {names.get(mirred['ifindex'])}"
                            )
                if entries:
                    out[name] = sorted(entries)
        return out

    return netns.run_in(path, body)


def _normalise(twin: Twin, data) -> dict:
    text = json.dumps(data, sort_keys=True).replace(twin.ctr.path, "SANDBOX")
    text = re.sub(r"\bbwp[0-9a-f]{12}\b", "IFB", text)
    out = json.loads(re.sub(r'"([0-9a-f]{2}:){5}[0-9a-f]{2}"', '"MAC"', text))
    if isinstance(out, dict) and out.get("dns") == {}:
        del out["dns"]
    return out


def _ifbs(twin: Twin) -> dict:
    return {n: v for n, v in read_state(twin.host.path)["links"].items() if n.startswith("bwp")}


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0"])
def test_add_check_del_match_the_reference(twins, version):
    seen = {}
    for impl, twin in twins.items():
        _prepare(twin)
        conf = _conf(twin, version, **SHAPED)
        result = twin.run("bandwidth", "ADD", conf)
        state = _normalise(twin, [_tc_state(twin.host.path), _ifbs(twin)])
        twin.run("bandwidth", "CHECK", {**conf, "prevResult": result})
        twin.run("bandwidth", "DEL", conf)
        after = (_tc_state(twin.host.path), _ifbs(twin))
        twin.run("bandwidth", "DEL", conf)
        seen[impl] = (_normalise(twin, result), state, after)
    for impl in ("inproc", "exec"):
        assert seen[impl][:2] == seen["go"][:2], impl
        assert seen[impl][2] == ({}, {}), impl  # ifb, tbf and ingress qdisc all gone
    result, (tc_state, ifbs), (go_after_tc, go_after_ifbs) = seen["go"]
    assert go_after_ifbs == {} and set(go_after_tc) == {"hveth0"}  # Go leaves the host veth's qdiscs
    (ifb,) = ifbs
    assert result["interfaces"][-1] == {"name": ifb, "mac": "MAC"}
    assert ifbs[ifb]["mtu"] == 1500 and ifbs[ifb]["txqlen"] == 0 and ifbs[ifb]["up"]
    assert f"filter u32 prio 1 classid 10001 mirred 1 4 to {ifb}" in tc_state["hveth0"]
    assert tc_state[ifb] == ["tbf 10000 parent ffffffff rate 250000 limit 11250 buffer 312500"]


RUNTIME = {"bandwidth": {"ingressRate": 1_000_000, "ingressBurst": 1_000_000}}


@pytest.mark.parametrize(
    "top, expected",
    [
        ({}, {"hveth0": ["tbf 10000 parent ffffffff rate 125000 limit 128125 buffer 15625000"]}),
        ({"egressRate": 8_000_000, "egressBurst": 80_000}, None),  # top-level rates win: no ingress tbf
    ],
    ids=["capability", "top-level-wins"],
)
def test_the_capability_applies_when_the_config_has_no_rates(twins, top, expected):
    seen = {}
    for impl, twin in twins.items():
        _prepare(twin)
        conf = _conf(twin, runtimeConfig=RUNTIME, **top)
        result = twin.run("bandwidth", "ADD", conf)
        seen[impl] = (_normalise(twin, result), _normalise(twin, _tc_state(twin.host.path)))
        twin.run("bandwidth", "DEL", conf)
    assert seen["inproc"] == seen["exec"] == seen["go"]
    if expected is not None:
        assert seen["go"][1] == expected
    else:
        assert not any(q.startswith("tbf") for q in seen["go"][1]["hveth0"])


def test_no_rates_pass_the_prev_result_through(twins):
    for impl, twin in twins.items():
        _prepare(twin)
        conf = _conf(twin, ingressRate=0, ingressBurst=0)
        result = twin.run("bandwidth", "ADD", conf)
        assert _normalise(twin, result) == _normalise(twin, conf["prevResult"]), impl
        assert _tc_state(twin.host.path) == {}, impl


def test_check_notices_other_rates_and_a_missing_ifb(twins):
    for impl, twin in twins.items():
        _prepare(twin)
        conf = _conf(twin, **SHAPED)
        result = twin.run("bandwidth", "ADD", conf)
        checked = {**conf, "prevResult": result}
        assert twin.outcome("bandwidth", "CHECK", {**checked, "ingressRate": 8_000_000}) == (
            "error",
            999,
            "Rate doesn't match",
        ), impl
        assert twin.outcome("bandwidth", "CHECK", {**checked, "egressBurst": 80_000}) == (
            "error",
            999,
            "Limit doesn't match",
        ), impl
        assert twin.outcome("bandwidth", "CHECK", conf | {"prevResult": None}) == (
            "error",
            999,
            "must be called as a chained plugin",
        ), impl
        twin.run("bandwidth", "DEL", conf)
        outcome = twin.outcome("bandwidth", "CHECK", checked)
        assert outcome[0:2] == ("error", 999), impl
        assert outcome[2] in ("get ifb device: Link not found", "Failed to find qdisc"), impl


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"ingressRate": 1000}, "if rate is set, burst must also be set"),
        ({"egressBurst": 1000}, "if burst is set, rate must also be set"),
        ({"ingressRate": 1000, "ingressBurst": 8 * 2**32}, "burst cannot be more than 4GB"),
        (
            {"ingressRate": 2**64, "ingressBurst": 1000},
            "failed to parse network configuration: json: cannot unmarshal number 18446744073709551616 "
            "into Go struct field PluginConf.ingressRate of type uint64",
        ),
        ({"egressRate": -1, "egressBurst": 1000}, None),
        ({"egressRate": "1000", "egressBurst": 1000}, None),
    ],
)
def test_bad_rates_are_refused_before_anything_changes(twins, extra, message):
    for impl, twin in twins.items():
        _prepare(twin)
        outcome = twin.outcome("bandwidth", "ADD", _conf(twin, **extra))
        assert outcome[0:2] == ("error", 999), (impl, outcome)
        if message:
            assert outcome[2] == message, impl
        else:
            assert outcome[2].startswith("failed to parse network configuration: json: cannot unmarshal"), impl
        assert _tc_state(twin.host.path) == {} and _ifbs(twin) == {}, impl


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"ingressRate": 7, "ingressBurst": 1000}, "invalid ingress bandwidth: rate and burst must be at least 8 bits"),
        (
            {"egressRate": 8 * 2**32, "egressBurst": 80_000},
            "invalid egress bandwidth: rate 34359738368 bit/s is above 34359738360 bit/s",
        ),
        (
            {"ingressRate": 8, "ingressBurst": 8 * 2**31},
            "invalid ingress bandwidth: burst 17179869184 bits lasts too long at 8 bit/s",
        ),
    ],
)
def test_rates_the_kernel_cannot_hold_are_refused_by_pycni(twins, extra, message):
    for impl in ("inproc", "exec"):
        twin = twins[impl]
        _prepare(twin)
        assert twin.outcome("bandwidth", "ADD", _conf(twin, **extra)) == ("error", 999, message), impl
        assert _tc_state(twin.host.path) == {} and _ifbs(twin) == {}, impl


def test_a_failed_add_leaves_nothing(twins):
    twin = twins["inproc"]
    _prepare(twin)
    conf = _conf(twin, **SHAPED)
    netns.run_in(twin.host.path, _add_ingress_qdisc, "hveth0")  # someone else's: the ADD must fail
    before = _tc_state(twin.host.path)
    outcome = twin.outcome("bandwidth", "ADD", conf)
    assert outcome[0:2] == ("error", 999) and outcome[2].startswith("create ingress qdisc: ")
    assert _tc_state(twin.host.path) == before and _ifbs(twin) == {}
    assert not list((twin.root / "pycni-state" / "bandwidth").glob("*"))


def _add_ingress_qdisc(ifname: str) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        ipr.tc("add", "ingress", ipr.link_lookup(ifname=ifname)[0], 0xFFFF0000)


def test_gc_removes_the_ifb_of_a_gone_attachment(twins):
    twin = twins["inproc"]
    _prepare(twin)
    conf = _conf(twin, "1.1.0", **SHAPED)
    twin.run("bandwidth", "ADD", conf)
    assert _ifbs(twin)
    twin.run("bandwidth", "GC", {**conf, "cni.dev/valid-attachments": [{"containerID": "other", "ifname": "eth0"}]})
    assert _ifbs(twin) == {} and _tc_state(twin.host.path) == {}


# --- shaping, measured ---------------------------------------------------------------------------

TRANSFER = 1_000_000  # bytes: 2 s at 4 Mbit/s, 4 s at 2 Mbit/s


def _transfer(src: str, dst: str, dst_ip: str, nbytes: int) -> float:
    """Seconds to send ``nbytes`` over one TCP connection from namespace ``src`` to ``dst``."""

    def listener() -> socket.socket:
        s = socket.socket()
        s.bind((dst_ip, 0))
        s.listen(1)
        s.settimeout(30)
        return s

    server = netns.run_in(dst, listener)
    port = server.getsockname()[1]
    received: list[float] = []

    def receive() -> None:
        conn, _ = server.accept()
        with conn:
            conn.settimeout(30)
            got = 0
            while got < nbytes:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                got += len(chunk)
            received.append(time.monotonic() if got >= nbytes else float("nan"))

    worker = threading.Thread(target=receive)
    worker.start()
    client = netns.run_in(src, socket.create_connection, (dst_ip, port), 30)
    start = time.monotonic()
    try:
        client.sendall(b"\0" * nbytes)
        worker.join(60)
    finally:
        client.close()
        server.close()
    assert received and received[0] == received[0], "transfer did not complete"
    return received[0] - start


@pytest.mark.parametrize("impl", ["go", "inproc"])
def test_shaping_holds_the_configured_rates(twins, impl):
    twin = twins[impl]
    _prepare(twin)
    unshaped = _transfer(twin.host.path, twin.ctr.path, CTR_IP, TRANSFER)
    conf = _conf(twin, **SHAPED)
    twin.run("bandwidth", "ADD", conf)
    try:
        into = TRANSFER * 8 / _transfer(twin.host.path, twin.ctr.path, CTR_IP, TRANSFER)
        out = TRANSFER * 8 / _transfer(twin.ctr.path, twin.host.path, HOST_IP, TRANSFER)
    finally:
        twin.run("bandwidth", "DEL", conf)
    # tbf never lets more through than rate plus one bucket; a loaded machine may send less.
    assert 0.6 * SHAPED["ingressRate"] <= into <= 1.1 * SHAPED["ingressRate"], into
    assert 0.6 * SHAPED["egressRate"] <= out <= 1.1 * SHAPED["egressRate"], out
    assert TRANSFER * 8 / unshaped > 10 * SHAPED["ingressRate"]  # the limit is the shaping's
