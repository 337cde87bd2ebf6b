#!/usr/bin/python3 -IS
"""A scriptable CNI plugin for runtime tests (stdlib only, so it starts fast).

Its behaviour comes from the ``fake`` key of its own stdin config, keyed by ``CNI_COMMAND``:
``{"result": {...}}`` print it; ``{"error": {...}, "exit": N}`` print a CNI error; ``{"stdout":
"...", "stderr": "...", "exit": N}`` raw output; ``{"sleep": S}`` hang first; ``{"big": N}``
print N bytes; ``{"holder": S}`` fork a child that keeps stdout open for S seconds;
``{"kill": SIG}`` die by a signal; ``{"echo_prev": true}`` return prevResult (or a default).
Every call is appended to ``fake.log`` (a JSON line with the env's CNI_* and the stdin) and a
``pidfile`` records the pids it spawned, so tests can prove nothing is left running.
"""

import json
import os
import sys
import time

cmd = os.environ.get("CNI_COMMAND", "")
raw = sys.stdin.read()
conf = json.loads(raw) if raw else {}
fake = conf.get("fake", {})
log = fake.get("log")
if log:
    with open(log, "a") as f:
        env = {k: v for k, v in os.environ.items() if k.startswith(("CNI_", "FAKE_")) or k == "PYCNI_STATE_DIR"}
        f.write(json.dumps({"type": os.path.basename(sys.argv[0]), "env": env, "stdin": conf}) + "\n")
if cmd == "VERSION":
    version = fake.get("version")
    if version == "unknown":
        print(json.dumps({"code": 4, "msg": "unknown CNI_COMMAND: VERSION"}))
        sys.exit(1)
    print(json.dumps(version or {"cniVersion": "1.1.0", "supportedVersions": ["0.3.1", "0.4.0", "1.0.0", "1.1.0"]}))
    sys.exit(0)
spec = fake.get(cmd, {})
if fake.get("pidfile"):
    with open(fake["pidfile"], "a") as f:
        f.write(f"{os.getpid()}\n")
if "holder" in spec:
    pid = os.fork()
    if pid == 0:
        with open(fake["pidfile"], "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(spec["holder"])
        os._exit(0)
if "sleep" in spec:
    time.sleep(spec["sleep"])
if "kill" in spec:
    os.kill(os.getpid(), spec["kill"])
if "big" in spec:
    chunk = b"x" * 65536
    left = spec["big"]
    while left > 0:
        os.write(1, chunk[: min(left, len(chunk))])
        left -= len(chunk)
    sys.exit(spec.get("exit", 0))
if "stderr" in spec:
    sys.stderr.write(spec["stderr"])
if "stdout" in spec:
    sys.stdout.write(spec["stdout"])
    sys.exit(spec.get("exit", 0))
if "error" in spec:
    print(json.dumps(spec["error"]))
    sys.exit(spec.get("exit", 1))
if cmd == "ADD":
    if "result" in spec:
        print(json.dumps(spec["result"]))
    elif spec.get("echo_prev") and "prevResult" in conf:
        print(json.dumps(conf["prevResult"]))
    else:
        ip = {"address": "198.18.0.2/24", "gateway": "198.18.0.1", "interface": 0}
        if conf.get("cniVersion") in ("0.3.0", "0.3.1", "0.4.0"):
            ip["version"] = "4"
        print(
            json.dumps(
                {
                    "cniVersion": conf.get("cniVersion", ""),
                    "interfaces": [
                        {"name": os.environ.get("CNI_IFNAME", ""), "sandbox": os.environ.get("CNI_NETNS", "")}
                    ],
                    "ips": [ip],
                }
            )
        )
sys.exit(spec.get("exit", 0))
