"""Kernel helpers shared by the in-process plugins: their ground floor, which imports nothing
else of ``pycni_plugins`` (``tests/unit/test_layers.py``).

- :mod:`.errors` — :class:`~.errors.LinkError` (a kernel refusal) and the CNI errors made of it;
- :mod:`.links`  — links, addresses and routes through pyroute2 (imported with it: ~130 ms, so
  plugins that need netlink only sometimes import it lazily), and a link delete that returns as
  soon as the kernel has unlisted the device;
- :mod:`.conntrack` — conntrack entries through pyroute2 (portmap's stale UDP flows);
- :mod:`.sysctl` — ``/proc/sys`` reads and writes in the calling thread's namespace;
- :mod:`.nft`    — the one nftables transaction builder, pycni's table, per-attachment records;
- :mod:`.state`  — the private state dir those records live in;
- :mod:`.owned`  — per-attachment link records (veths, sub-links, moved devices): what DEL may take;
- :mod:`.layout` — what lives in that table (masquerade, host ports, forward filter, spoof check).

Namespaces are entered only through :mod:`pycni.netns`.
"""
