"""A storm worker: runs CNI operations sent as JSON lines on stdin, answers on stdout.

Each task is ``{"op", "cid", "netns", "failpoints"?}``; the worker enters the throwaway host
namespace once, runs the op through an in-process runtime, and answers ``{"ok", "ips", "error",
"start", "end"}`` (CLOCK_MONOTONIC, comparable across processes). A task with failpoints may
kill the worker outright, exactly as a crash would: the parent notices the closed pipe.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    host, cache_dir, conflist = sys.argv[1], sys.argv[2], sys.argv[3]
    from pycni import failpoints, netns
    from pycni.config import conflist_from_bytes
    from pycni.errors import CNIError
    from pycni.runtime import Runtime
    from pycni.runtime_conf import RuntimeConf

    network = conflist_from_bytes(conflist.encode())
    runtime = Runtime([], cache_dir=cache_dir, backend="inprocess")
    with netns.entered(host):
        for line in sys.stdin:
            task = json.loads(line)
            os.environ["PYCNI_FAILPOINTS"] = task.get("failpoints", "")
            failpoints.reload()
            rt = RuntimeConf(
                task["cid"],
                task["netns"],
                "eth0",
                args=[("IgnoreUnknown", "1")],
                capability_args={"portMappings": task.get("ports", [])},
            )
            out: dict = {"ok": True, "ips": [], "error": ""}
            start = time.monotonic()
            try:
                if task["op"] == "add":
                    result = runtime.add_network_list(network, rt)
                    out["ips"] = [str(ip.address.ip) for ip in result.ips]
                elif task["op"] == "check":
                    runtime.check_network_list(network, rt)
                else:
                    runtime.delete_network_list(network, rt)
            except CNIError as e:
                out.update(ok=False, error=str(e))
            out.update(start=start, end=time.monotonic())
            sys.stdout.write(json.dumps(out) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
