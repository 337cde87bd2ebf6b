"""What every real-client test checks: the running container's attachment, then that nothing is left."""

from __future__ import annotations

import ipaddress
import json
import re
import time
from typing import Any

from pycni import testing

from .sandbox import Interactive, Sandbox

__all__ = ["write_conflist", "check_attached", "settled_leftovers"]


def write_conflist(sandbox: Sandbox, name: str, bridge: str, subnet: str, gateway: str) -> None:
    """A podman-style bridge network (bridge + host-local, portmap, firewall) in the conf dir."""
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
    (sandbox.conf_dir / f"10-{name}.conflist").write_text(json.dumps(conflist, indent=2))


def check_attached(sandbox: Sandbox, running: Interactive, subnet: str, gateway: str) -> dict[str, Any]:
    """Once the container reports in: its eth0 address is from ``subnet``, it pinged the gateway,
    the host reaches it, and the host side holds exactly one attachment (veth, lease, cache entry,
    nft elements). Returns that attachment's view (``ip``, ``lease`` owner)."""
    out = running.wait_for("READY")
    found = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/(\d+)", out)
    assert found, f"no IPv4 address on eth0: {out!r}"
    ip = found[1]
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(subnet) and ip != gateway, out
    assert "PING-OK" in out, f"container could not ping its gateway {gateway}: {out!r}"
    assert testing.ping(sandbox.host.path, ip, timeout=3), f"host cannot ping the container at {ip}"
    leases = sandbox.leases()
    assert list(leases) == [ip], leases
    assert len(sandbox.veths()) == 1, sandbox.veths()
    assert len(sandbox.cached()) == 1, sandbox.cached()
    assert len(sandbox.nft_attachments()) == 1, sandbox.nft_attachments()
    return {"ip": ip, "lease": leases[ip]}


def settled_leftovers(sandbox: Sandbox, timeout: float = 10.0) -> dict[str, Any]:
    """:meth:`Sandbox.leftovers` once empty, or as it is after ``timeout`` (a client's own cleanup
    may still be finishing just after the client returns: podman's conmon runs one too)."""
    deadline = time.monotonic() + timeout
    while (left := sandbox.leftovers()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
