"""Test-side views of kernel state inside a namespace (links, addresses, nftables, sysctls)."""

from __future__ import annotations

from typing import Any

from pycni import netns


def links(path: str) -> dict[str, dict[str, Any]]:
    """name → {kind, master (name), addresses [cidr], state} for every link in the namespace."""

    def read() -> dict[str, dict[str, Any]]:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            by_index = {link["index"]: link for link in ipr.get_links()}
            out = {}
            for link in by_index.values():
                info = link.get_attr("IFLA_LINKINFO")
                master = link.get_attr("IFLA_MASTER")
                out[link.get_attr("IFLA_IFNAME")] = {
                    "kind": info.get_attr("IFLA_INFO_KIND") if info else None,
                    "master": by_index[master].get_attr("IFLA_IFNAME") if master in by_index else None,
                    "state": link.get_attr("IFLA_OPERSTATE"),
                    "up": bool(link["flags"] & 1),
                    "mac": link.get_attr("IFLA_ADDRESS"),
                    "mtu": link.get_attr("IFLA_MTU"),
                    "addresses": [],
                }
            for addr in ipr.get_addr():
                name = by_index[addr["index"]].get_attr("IFLA_IFNAME")
                out[name]["addresses"].append(f"{addr.get_attr('IFA_ADDRESS')}/{addr['prefixlen']}")
            return out

    return netns.run_in(path, read)


def routes(path: str, family: int = 2) -> list[str]:
    def read() -> list[str]:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            out = []
            for r in ipr.get_routes(family=family, table=254):
                dst = r.get_attr("RTA_DST")
                out.append(f"{dst or 'default'}/{r['dst_len']} via {r.get_attr('RTA_GATEWAY')}")
            return out

    return netns.run_in(path, read)


def nft_ruleset(path: str) -> str:
    """``nft list ruleset`` inside the namespace (the iptables-nft rules of the reference show here)."""

    def read() -> str:
        from pycni._libnftables import Nftables

        nft = Nftables()
        rc, out, err = nft.cmd("list ruleset")
        assert rc == 0, err
        return out

    return netns.run_in(path, read)


def sysctl(path: str, name: str) -> str:
    def read() -> str:
        with open("/proc/sys/" + name.replace(".", "/")) as f:
            return f.read().strip()

    return netns.run_in(path, read)
