"""What every real-client test checks: the running container's attachment, then that nothing is left."""

from __future__ import annotations

import ipaddress
import json
import re
import time
from typing import Any

from pycni.chain import fold
from pycni.testing import probes

from .sandbox import Interactive, Sandbox

__all__ = ["write_conflist", "check_attached", "settled_leftovers"]


def write_conflist(
    sandbox: Sandbox, name: str, bridge: str, subnet: str, gateway: str, *, folded: bool = False
) -> None:
    """A podman-style bridge network (bridge + host-local, portmap, firewall) in the conf dir,
    ``folded`` into one ``pycni-chain`` plugin or as a plain list."""
    conflist = {
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "ranges": [[{"subnet": subnet, "gateway": gateway}]],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "firewall"},
        ],
    }
    data = json.dumps(conflist, indent=2).encode()
    (sandbox.conf_dir / f"10-{name}.conflist").write_bytes(fold(data) if folded else data)


def check_attached(sandbox: Sandbox, subnet: str, gateway: str, *running: Interactive) -> list[dict[str, str]]:
    """Once every container reports in: each eth0 address is from ``subnet`` (all distinct), each
    container pinged the gateway, the host reaches each, and the host side holds exactly one
    attachment per container (veth, lease, cache entry, nft elements). Returns each one's
    ``ip`` and ``lease`` owner."""
    out = []
    for container in running:
        text = container.wait_for("READY")
        found = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/(\d+)", text)
        assert found, f"no IPv4 address on eth0: {text!r}"
        ip = found[1]
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(subnet) and ip != gateway, text
        assert "PING-OK" in text, f"container could not ping its gateway {gateway}: {text!r}"
        assert probes.ping(sandbox.host.path, ip, timeout=3), f"host cannot ping the container at {ip}"
        out.append({"ip": ip})
    leases = sandbox.leases()
    assert sorted(leases) == sorted(a["ip"] for a in out), leases  # distinct, and nothing else
    for attached in out:
        attached["lease"] = leases[attached["ip"]]
    n = len(running)
    assert len(sandbox.veths()) == n, sandbox.veths()
    assert len(sandbox.cached()) == n, sandbox.cached()
    assert len(sandbox.nft_attachments()) == n, sandbox.nft_attachments()
    return out


def settled_leftovers(sandbox: Sandbox, timeout: float = 10.0) -> dict[str, Any]:
    """:meth:`Sandbox.leftovers` once empty, or as it is after ``timeout`` (a client's own cleanup
    may still be finishing just after the client returns: podman's conmon runs one too)."""
    deadline = time.monotonic() + timeout
    while (left := sandbox.leftovers()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
