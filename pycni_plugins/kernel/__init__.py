"""Kernel helpers shared by the in-process plugins.

- :mod:`.links`  — links, addresses and routes over raw rtnetlink (no pyroute2 import on the
  plugin path: it alone costs ~130 ms), and a link delete that returns as soon as the kernel
  has unlisted the device;
- :mod:`.sysctl` — ``/proc/sys`` reads and writes in the calling thread's namespace;
- :mod:`.nft`    — the one nftables transaction builder, pycni's table, per-attachment records;
- :mod:`.state`  — the private state dir those records live in;
- :mod:`.layout` — what lives in that table (masquerade, host ports, forward filter, spoof check).

Namespaces are entered only through :mod:`pycni.netns`.
"""
