"""The plugins' state dir is a runtime parameter: two runtimes with two state dirs in one process
keep their records apart, in-process and exec'd; a state dir that is not private is refused."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from pycni import netns
from pycni.config import conflist_from_bytes
from pycni.errors import CNIError, ErrorCode
from pycni.runtime import Runtime
from pycni.runtime_conf import RuntimeConf
from pycni.sdk import Attachment
from pycni_plugins.kernel import nft

pytestmark = pytest.mark.privileged

CID = "same-ctr"


def _network(name: str, bridge: str, subnet: str, data_dir: str) -> Any:
    bridge_conf = {
        "type": "bridge",
        "bridge": bridge,
        "isGateway": True,
        "ipMasq": True,
        "macspoofchk": True,
        "ipam": {"type": "host-local", "dataDir": data_dir, "ranges": [[{"subnet": subnet}]]},
    }
    plugins = [{"type": "loopback"}, bridge_conf, {"type": "portmap", "capabilities": {"portMappings": True}}]
    return conflist_from_bytes(json.dumps({"cniVersion": "1.0.0", "name": name, "plugins": plugins}).encode())


def _records(root: str) -> set[str]:
    """``kind/name`` of every record under a state dir (the nft epoch token left out)."""
    if not os.path.isdir(root):
        return set()
    return {
        f"{kind}/{name}"
        for kind in os.listdir(root)
        for name in os.listdir(os.path.join(root, kind))
        if not name.startswith(".") and (kind, name) != ("nft", "epoch")
    }


@pytest.mark.parametrize("backend", ["inprocess", "exec"])
def test_two_runtimes_with_two_state_dirs_in_one_process_keep_their_records_apart(
    backend, host_ns, make_netns, tmp_path, state_dir
):
    from pycni_plugins.install import install

    bindir = tmp_path / "bin"
    install(str(bindir), ["loopback", "bridge", "host-local", "portmap"])
    ctr = make_netns("c")
    sides: dict[str, tuple[Runtime, Any, RuntimeConf]] = {}
    for tag, subnet, port, ifname in (("a", "198.18.81.0/24", 8081, "eth0"), ("b", "198.18.82.0/24", 8082, "eth1")):
        runtime = Runtime(
            [str(bindir)],
            cache_dir=str(tmp_path / f"cache-{tag}"),
            state_dir=str(tmp_path / f"state-{tag}"),
            backend=backend,
            host_netns=host_ns.path,
        )
        network = _network(f"net{tag}", f"pbr{tag}", subnet, str(tmp_path / f"ipam-{tag}"))
        ports = {"portMappings": [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]}
        sides[tag] = (runtime, network, RuntimeConf(CID, ctr.path, ifname, capability_args=ports))
    keys = {tag: Attachment(net.name, CID, rt.ifname).key for tag, (_, net, rt) in sides.items()}
    for runtime, network, rt in sides.values():
        runtime.add_network_list(network, rt)

    for tag, (runtime, _, _) in sides.items():
        expected = {f"{kind}/{keys[tag]}" for kind in ("loopback", "bridge")} | {
            f"nft/{keys[tag]}.{owner}" for owner in ("spoofchk", "masq", "portmap")
        }
        assert _records(runtime.state_dir) == expected
    assert not os.path.exists(state_dir), "nothing went to $PYCNI_STATE_DIR"

    def groups(tag: str) -> dict[str, Any]:
        return netns.run_in(host_ns.path, nft.attachments, sides[tag][0].state_dir)

    runtime, network, rt = sides["a"]
    runtime.delete_network_list(network, rt)
    assert _records(runtime.state_dir) == set()
    left = groups("b")
    assert set(left) == {keys["b"]}, "a's DEL removed a's elements, and only those"
    assert set(left[keys["b"]]["elements"]) == {"spoofchk", "masq", "portmap"}
    assert len(_records(sides["b"][0].state_dir)) == 5
    runtime, network, rt = sides["b"]
    runtime.delete_network_list(network, rt)
    assert _records(runtime.state_dir) == set()
    assert groups("a") == groups("b") == {}
    assert not os.path.exists(state_dir)


@pytest.mark.parametrize("explicit", [True, False])
def test_a_state_dir_that_is_not_private_is_refused_with_an_io_error(
    explicit, host_ns, make_netns, tmp_path, state_dir
):
    """Explicit or from ``$PYCNI_STATE_DIR``: the same rule, the same CNI error code."""
    root = str(tmp_path / "shared-state") if explicit else state_dir
    os.makedirs(os.path.join(root, "loopback"), mode=0o700)
    os.chmod(os.path.join(root, "loopback"), 0o755)  # anyone may read what DEL will trust
    ctr = make_netns("c")
    network = conflist_from_bytes(
        json.dumps({"cniVersion": "1.0.0", "name": "net", "plugins": [{"type": "loopback"}]}).encode()
    )
    runtime = Runtime(
        [],
        cache_dir=str(tmp_path / "cache"),
        state_dir=root if explicit else None,
        backend="inprocess",
        host_netns=host_ns.path,
    )
    with pytest.raises(CNIError, match="refusing state dir .*loopback: .*must be private to uid") as info:
        runtime.add_network_list(network, RuntimeConf(CID, ctr.path, "eth0"))
    assert info.value.code == ErrorCode.IO_FAILURE


@pytest.mark.parametrize("backend", ["inprocess", "exec"])
def test_a_symlinked_state_dir_is_refused_with_an_io_error(
    backend, host_ns, make_netns, tmp_path, monkeypatch, symlinked_state_dir
):
    """``$PYCNI_STATE_DIR`` a symlink to a private directory: the same refusal, not a traceback."""
    link, real = symlinked_state_dir
    monkeypatch.setenv("PYCNI_DAEMON", "off")
    ctr = make_netns("c")
    network = conflist_from_bytes(
        json.dumps({"cniVersion": "1.0.0", "name": "net", "plugins": [{"type": "loopback"}]}).encode()
    )
    plugin_dir = tmp_path / "bin"
    if backend == "exec":
        from pycni_plugins.install import install

        install(str(plugin_dir))
    runtime = Runtime([str(plugin_dir)], cache_dir=str(tmp_path / "cache"), backend=backend, host_netns=host_ns.path)
    with pytest.raises(CNIError, match=f"refusing state dir {link}: it is a symlink") as info:
        runtime.add_network_list(network, RuntimeConf(CID, ctr.path, "eth0"))
    assert info.value.code == ErrorCode.IO_FAILURE
    assert os.listdir(real) == []
