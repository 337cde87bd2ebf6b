"""``pycni nomad …`` through click's CliRunner: JSON in, JSON out, one-line errors with CNI codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pycni.cli.nomad import nomad

from .conftest import FIXTURES

ALLOC = str(FIXTURES / "connect_tproxy_alloc.json")
BRIDGE = str(FIXTURES / "bridge_ports_alloc.json")
LEGACY = str(FIXTURES / "legacy_networks_alloc.json")
NODE = str(FIXTURES / "node.json")


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_conflist_defaults_are_the_clients(runner: CliRunner) -> None:
    out = runner.invoke(nomad, ["conflist"])
    assert out.exit_code == 0
    conf = json.loads(out.stdout_bytes)
    assert conf["plugins"][1]["bridge"] == "nomad"
    assert conf["plugins"][1]["ipam"]["ranges"] == [[{"subnet": "172.26.64.0/20"}]]
    assert not out.stdout_bytes.endswith(b"\n")


@pytest.mark.parametrize(
    ("args", "golden"),
    [
        (["--subnet-ipv6", "3fff:cab0:0d13::/120"], "ipv6"),
        (["--hairpin"], "hairpin"),
        (["--hairpin", "--bridge-name", 'bad"'], "bad_input"),
        (["--hairpin", "--consul-cni"], "consul-cni"),
    ],
)
def test_conflist_matches_nomads_goldens(runner: CliRunner, args: list[str], golden: str) -> None:
    out = runner.invoke(nomad, ["conflist", *args])
    assert out.exit_code == 0, out.output
    assert out.stdout_bytes + b"\n" == (FIXTURES / "conflist" / f"{golden}.conflist.json").read_bytes()


def test_conflist_refuses_a_bad_subnet(runner: CliRunner) -> None:
    out = runner.invoke(nomad, ["conflist", "--subnet", "fd00::/64"])
    assert out.exit_code == 1
    assert out.stderr == "pycni: error (code 7): invalid bridge_network_subnet: not an IPv4 address: fd00::/64\n"


def test_ports_in_order_with_host_ip_only_when_set(runner: CliRunner) -> None:
    out = runner.invoke(nomad, ["ports", "--alloc", BRIDGE])
    assert out.exit_code == 0
    ports = json.loads(out.stdout)
    assert ports[0] == {
        "label": "https",
        "hostPort": 8443,
        "containerPort": 443,
        "protocol": "tcp",
        "hostIP": "192.168.56.11",
    }
    assert [(p["label"], p["protocol"]) for p in ports] == [
        (label, proto) for label in ("https", "http", "admin") for proto in ("tcp", "udp")
    ]
    ignored = json.loads(runner.invoke(nomad, ["ports", "--alloc", BRIDGE, "--ignore-host-ip"]).stdout)
    assert all("hostIP" not in p for p in ignored)


def test_ports_reads_stdin(runner: CliRunner) -> None:
    out = runner.invoke(nomad, ["ports", "--alloc", "-"], input=Path(LEGACY).read_bytes())
    assert [p["hostPort"] for p in json.loads(out.stdout)] == [27001, 27001, 6379, 6379]


def test_tproxy_prints_the_exact_value(runner: CliRunner) -> None:
    out = runner.invoke(nomad, ["tproxy", "--alloc", ALLOC, "--node", NODE, "--netns", "/var/run/netns/a1"])
    assert out.exit_code == 0
    assert out.stdout == (
        '{"ConsulDNSIP":"10.0.2.15","ConsulDNSPort":8600,"ProxyUserID":"101","ProxyInboundPort":28734,'
        '"ProxyOutboundPort":15001,"ExcludeInboundPorts":["25318","9102","9999"],'
        '"ExcludeOutboundPorts":["8500","443"],"ExcludeOutboundCIDRs":["10.0.0.0/8"],"ExcludeUIDs":["1000"],'
        '"NetNS":"/var/run/netns/a1","IptablesProvider":null}\n'
    )


def test_tproxy_is_null_without_transparent_proxy(runner: CliRunner) -> None:
    out = runner.invoke(nomad, ["tproxy", "--alloc", BRIDGE, "--node", NODE, "--netns", "/x"])
    assert (out.exit_code, out.stdout) == (0, "null\n")


def test_tproxy_error_exits_1_with_one_line(runner: CliRunner, tmp_path: Path) -> None:
    node = json.loads(Path(NODE).read_text())
    del node["Meta"]["connect.transparent_proxy.default_outbound_port"]
    (tmp_path / "node.json").write_text(json.dumps(node))
    out = runner.invoke(nomad, ["tproxy", "--alloc", ALLOC, "--node", str(tmp_path / "node.json"), "--netns", "/x"])
    assert out.exit_code == 1
    assert out.stderr == (
        'pycni: error (code 7): could not parse default_outbound_port "" as port number: strconv.ParseUint: '
        'parsing "": invalid syntax\n'
    )


def test_cni_args(runner: CliRunner) -> None:
    out = runner.invoke(nomad, ["cni-args", "--alloc", BRIDGE, "--node", NODE, "--netns", "/x"])
    assert out.exit_code == 0
    assert json.loads(out.stdout) == {
        "IgnoreUnknown": "true",
        "K8S_POD_NAMESPACE": "web",
        "cni.dev/owner": "shop",
        "NOMAD_REGION": "eu-west",
        "NOMAD_NAMESPACE": "web",
        "NOMAD_JOB_ID": "shop",
        "NOMAD_GROUP_NAME": "frontend",
        "NOMAD_ALLOC_ID": "8c0e6d7a-1b2c-4d3e-9f40-5a6b7c8d9e0f",
    }


def test_cni_args_with_tproxy_and_a_skipped_job_id(runner: CliRunner) -> None:
    args = json.loads(runner.invoke(nomad, ["cni-args", "--alloc", ALLOC, "--node", NODE, "--netns", "/n"]).stdout)
    assert json.loads(args["CONSUL_IPTABLES_CONFIG"])["NetNS"] == "/n"
    legacy = runner.invoke(nomad, ["cni-args", "--alloc", LEGACY, "--node", NODE, "--netns", "/n"])
    assert "NOMAD_JOB_ID" not in json.loads(legacy.stdout)  # "legacy;job" contains the pair separator


def test_status_from_go_result(runner: CliRunner, tmp_path: Path) -> None:
    result = {
        "Interfaces": {
            "eth0": {"IPConfigs": [{"IP": "172.26.64.9", "Gateway": "172.26.64.1"}], "Mac": "m", "Sandbox": "/n"},
            "nomad": {"IPConfigs": None, "Mac": "b", "Sandbox": ""},
        },
        "DNS": [{}],
    }
    (tmp_path / "r.json").write_text(json.dumps(result))
    out = runner.invoke(nomad, ["status", str(tmp_path / "r.json")])
    assert out.exit_code == 0
    assert json.loads(out.stdout) == {"InterfaceName": "eth0", "Address": "172.26.64.9", "AddressIPv6": "", "DNS": None}


def test_status_from_plain_cni_result(runner: CliRunner) -> None:
    plain = {
        "cniVersion": "0.4.0",
        "interfaces": [{"name": "eth0", "sandbox": "/n"}],
        "ips": [{"version": "6", "interface": 0, "address": "fd00::9/64"}],
        "dns": {"nameservers": ["fd00::1"], "search": ["a"]},
    }
    out = runner.invoke(nomad, ["status", "-"], input=json.dumps(plain))
    assert json.loads(out.stdout) == {
        "InterfaceName": "eth0",
        "Address": "fd00::9",
        "AddressIPv6": "fd00::9",
        "DNS": {"Servers": ["fd00::1"], "Searches": ["a"], "Options": None},
    }


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"Interfaces": {}}, "pycni: error (code 6): failed to configure network: no interfaces found\n"),
        (
            {"Interfaces": {"eth0": {}}},
            "pycni: error (code 6): failed to configure network: no interface with an address\n",
        ),
        ("{", None),
    ],
)
def test_status_errors(runner: CliRunner, doc: object, message: str | None) -> None:
    out = runner.invoke(nomad, ["status", "-"], input=doc if isinstance(doc, str) else json.dumps(doc))
    assert out.exit_code == 1
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("pycni: error (code 6): ")
    if message is not None:
        assert out.stderr == message


def test_decode_errors_name_the_field(runner: CliRunner, tmp_path: Path) -> None:
    doc = json.loads(Path(BRIDGE).read_text())
    doc["AllocatedResources"]["Shared"]["Ports"][1]["Value"] = "x"
    (tmp_path / "a.json").write_text(json.dumps(doc))
    out = runner.invoke(nomad, ["ports", "--alloc", str(tmp_path / "a.json")])
    assert out.exit_code == 1
    assert out.stderr == (
        'pycni: error (code 6): AllocatedResources.Shared.Ports[1].Value: expected an integer, got "x"\n'
    )


@pytest.mark.parametrize(
    "args",
    [
        ["ports"],
        ["ports", "--alloc", "/nonexistent.json"],
        ["tproxy", "--alloc", ALLOC, "--node", NODE],
        ["conflist", "--bogus"],
        ["status"],
    ],
)
def test_usage_errors_exit_2(runner: CliRunner, args: list[str]) -> None:
    assert runner.invoke(nomad, args).exit_code == 2


def test_help_does_not_import_heavy_modules() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from click.testing import CliRunner; from pycni.cli.nomad import nomad; "
        "CliRunner().invoke(nomad, ['--help']); "
        "print(sorted(m for m in sys.modules if m.startswith(('pyroute2', 'pycni._libnftables', 'pycni.nomad'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
