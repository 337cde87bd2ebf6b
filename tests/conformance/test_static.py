"""static IPAM: pycni (in-process and exec'd) against Debian's Go plugin on the same configs.

static touches no kernel state: the twins compare results, CHECK and errors (code and text).
1.1.1 prints an empty ``"dns": {}`` for 1.x results, which v1.9.1 (and pycni) omit.
"""

from __future__ import annotations

import pytest

from .twins import Twin

pytestmark = [pytest.mark.privileged, pytest.mark.reference]

ADDRESSES = [
    {"address": "198.18.0.5/24", "gateway": "198.18.0.1"},
    {"address": "198.18.1.5/24"},
    {"address": "fd00:18::5/64", "gateway": "fd00:18::1"},
]
ROUTES = [{"dst": "0.0.0.0/0"}, {"dst": "198.19.0.0/16", "gw": "198.18.0.254"}, {"dst": "::/0", "gw": "fd00:18::1"}]
DNS = {"nameservers": ["198.18.0.53"], "domain": "example.test", "search": ["example.test"], "options": ["ndots:2"]}


def _conf(version: str = "1.0.0", **ipam) -> dict:
    return {"cniVersion": version, "name": "staticnet", "ipam": {"type": "static", **ipam}}


def _same(twins: dict[str, Twin], command: str, conf: dict, **kw) -> object:
    seen = {}
    for impl, twin in twins.items():
        out = twin.outcome("static", command, conf, **kw)
        if isinstance(out, dict) and out.get("dns") == {}:
            del out["dns"]
        seen[impl] = out
    assert seen["inproc"] == seen["go"], seen
    assert seen["exec"] == seen["go"], seen
    return seen["go"]


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0", "1.0.0"])
def test_addresses_routes_and_dns(twins, version):
    result = _same(twins, "ADD", _conf(version, addresses=ADDRESSES, routes=ROUTES, dns=DNS))
    assert [ip["address"] for ip in result["ips"]] == ["198.18.0.5/24", "198.18.1.5/24", "fd00:18::5/64"]
    assert result["dns"] == DNS
    assert _same(twins, "DEL", _conf(version, addresses=ADDRESSES)) is None


@pytest.mark.parametrize(
    "args",
    [
        "IP=198.18.2.7/24",
        "IP=198.18.2.7/24, fd00:18::7/64;GATEWAY=198.18.2.1,fd00:18::1",
        "IgnoreUnknown=1;K8S_POD_NAME=x;IP=198.18.2.7/24",
        "GATEWAY=198.18.0.9",
    ],
)
def test_cni_args_ip_and_gateway(twins, args):
    result = _same(twins, "ADD", _conf(addresses=ADDRESSES[:1]), args=args)
    assert isinstance(result, dict) and result["ips"][0]["address"] == "198.18.0.5/24"


def test_args_cni_ips_and_runtime_config_ips_replace_the_addresses(twins):
    conf = _conf(addresses=ADDRESSES)
    by_args = _same(twins, "ADD", {**conf, "args": {"cni": {"ips": ["198.18.3.3/24"]}}}, args="IP=198.18.2.7/24")
    assert [ip["address"] for ip in by_args["ips"]] == ["198.18.3.3/24"]
    both = {**conf, "args": {"cni": {"ips": ["198.18.3.3/24"]}}, "runtimeConfig": {"ips": ["fd00:18::9/64"]}}
    by_runtime = _same(twins, "ADD", both)
    assert [ip["address"] for ip in by_runtime["ips"]] == ["fd00:18::9/64"]


def test_check(twins):
    conf = _conf(addresses=ADDRESSES)
    prev = twins["go"].run("static", "ADD", conf)
    assert _same(twins, "CHECK", {**conf, "prevResult": prev}) is None
    moved = {**prev, "ips": [{**prev["ips"][0], "gateway": "198.18.0.2"}, *prev["ips"][1:]]}
    assert _same(twins, "CHECK", {**conf, "prevResult": moved}) == (
        "error",
        999,
        "static: Failed to match addr 198.18.0.5 on interface eth0",
    )
    assert _same(twins, "CHECK", conf) == ("error", 999, "Required prevResult missing")


@pytest.mark.parametrize(
    "conf, args",
    [
        ({"cniVersion": "1.0.0", "name": "staticnet"}, ""),
        (_conf(addresses=[{"address": "198.18.0.5"}]), ""),
        (_conf(addresses=[{"address": "not-an-ip/24"}]), ""),
        (_conf(addresses=[{"gateway": "198.18.0.1"}]), ""),
        (_conf(addresses=ADDRESSES[:1]), "IP=198.18.0.9"),
        (_conf(addresses=ADDRESSES[:1]), "GATEWAY=bogus"),
        (_conf(addresses=ADDRESSES[:1]), "FOO=bar"),
        ({**_conf(), "runtimeConfig": {"ips": ["198.18.0.5"]}}, ""),
        ({**_conf(), "args": {"cni": {"ips": ["x/33"]}}}, ""),
        (_conf("0.2.0", addresses=ADDRESSES[:2]), ""),
    ],
    ids=[
        "no-ipam",
        "no-prefix",
        "not-an-ip",
        "no-address",
        "env-no-prefix",
        "env-bad-gateway",
        "env-unknown",
        "runtime-no-prefix",
        "args-bad",
        "two-v4-at-0.2.0",
    ],
)
def test_bad_input_is_the_same_error(twins, conf, args):
    outcome = _same(twins, "ADD", conf, args=args)
    assert isinstance(outcome, tuple) and outcome[0] == "error"


def test_a_gateway_of_the_other_family_is_refused_by_pycni_only(twins):
    conf = _conf(addresses=[{"address": "198.18.0.5/24", "gateway": "fd00:18::1"}])
    go = twins["go"].outcome("static", "ADD", conf)
    assert isinstance(go, dict) and go["ips"][0]["gateway"] == "fd00:18::1"
    want = ("error", 999, "gateway fd00:18::1 is not of the same IP family as address 198.18.0.5/24")
    assert twins["inproc"].outcome("static", "ADD", conf) == want
    assert twins["exec"].outcome("static", "ADD", conf) == want
