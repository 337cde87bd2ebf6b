"""One CNI operation in a process of its own, so that a failpoint can SIGKILL it mid-way.

``python -m tests.faults.cni_driver SPEC`` where SPEC is a JSON object: ``op`` (add, del, check,
reconcile), ``host`` (the throwaway host namespace the plugins run in, via ``host_netns``),
``cache_dir``, ``conflist``, ``cid``, ``netns``, ``ports`` (portMappings), ``backend``
(default ``inprocess``) and ``path`` (CNI_PATH for exec'd plugins). Failpoints come from the
environment (``PYCNI_FAILPOINTS``). Prints ``{"ok", "ips", "error"}`` and exits 0 or 1.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    spec = json.loads(sys.argv[1])
    from pycni.config import conflist_from_bytes
    from pycni.errors import CNIError
    from pycni.runtime import Runtime
    from pycni.runtime_conf import RuntimeConf

    network = conflist_from_bytes(spec["conflist"].encode())
    runtime = Runtime(
        spec.get("path", []),
        cache_dir=spec["cache_dir"],
        backend=spec.get("backend", "inprocess"),
        host_netns=spec["host"],
        timeout=spec.get("timeout"),
    )
    rt = RuntimeConf(
        spec.get("cid", ""), spec.get("netns", ""), "eth0", capability_args={"portMappings": spec.get("ports", [])}
    )
    out: dict = {"ok": True, "ips": [], "error": ""}
    try:
        if spec["op"] == "add":
            result = runtime.add_network_list(network, rt)
            out["ips"] = [str(ip.address.ip) for ip in getattr(result, "ips", ())]
        elif spec["op"] == "del":
            runtime.delete_network_list(network, rt)
        elif spec["op"] == "check":
            runtime.check_network_list(network, rt)
        elif spec["op"] == "reconcile":
            out["report"] = runtime.reconcile_network_list(network, dry_run=spec.get("dry_run", False)).to_json()
    except CNIError as e:
        out.update(ok=False, error=str(e))
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
