"""Links through pyroute2, in the calling thread's network namespace, and the one door to it
(:func:`iproute`, :func:`call`); a link's addresses are in :mod:`.addressing`, routes and rules
in :mod:`.routing`.

A synchronous ``IPRoute`` belongs to the thread that opens it (pyroute2 keeps its socket and
asyncio loop per thread) and its socket to that thread's namespace at that moment. So every
function here takes the ``ipr`` of an :func:`iproute` block opened *in the same thread*, and
container-side callers open theirs inside :func:`pycni.netns.run_in`. ``IPRoute(netns=...)`` is
never used: it forks a helper, and by default creates a namespace that is missing.

A link is fetched with one ``RTM_GETLINK`` by index or name, never by filtering a dump (only
addresses and routes, which have no such request, are dumped). Every request costs ~0.3 ms of
pyroute2 encoding and decoding, so callers make as few as they can. Kernel errors come out as
:class:`LinkError` (:mod:`.errors`), an ``OSError`` carrying the kernel's errno: every request,
:mod:`.addressing`'s, :mod:`.routing`'s, :mod:`.tc`'s and :mod:`.conntrack`'s too, goes through
:func:`call`, the one place pyroute2's ``NetlinkError`` is translated. The plugins never use
pyroute2 themselves: what they need of it is here and there (:func:`link_info`,
:func:`.routing.dump_routes`, :func:`.routing.dump_rules`, macvlan's link kind).

:func:`delete_link` returns once the device is unlisted: the acknowledgement of the delete
request waits for the kernel's RCU barrier and refcount drain (~15-35 ms here), so a helper
thread sends it and waits for that alone.
"""

from __future__ import annotations

import atexit
import contextvars
import errno
import fcntl
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from logging import DEBUG
from typing import Any, TypeVar

import attrs
from pyroute2 import IPRoute, NetlinkError
from pyroute2.netlink import nlmsg_atoms
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg, macvx_data, state_by_code

from pycni import netns

from . import batch, changes
from .errors import LinkError

__all__ = [
    "IPRoute",
    "LOOPBACK_INDEX",
    "Link",
    "LinkError",
    "LinkInfo",
    "iproute",
    "keep_iproutes",
    "get_link",
    "fetch_link",
    "link_info",
    "ifindex",
    "flags_of",
    "dump_links",
    "netnsid",
    "random_mac",
    "random_veth_name",
    "ensure_bridge",
    "add_veth",
    "add_link",
    "call",
    "set_up",
    "set_down",
    "set_link",
    "set_master",
    "set_brport",
    "set_port_vlans",
    "delete_link",
    "wait_oper_up",
]

T = TypeVar("T")

# linux/if.h, linux/if_bridge.h
IFF_UP, IFF_PROMISC, IFF_ALLMULTI = 0x1, 0x100, 0x200
BRIDGE_VLAN_INFO_PVID, BRIDGE_VLAN_INFO_UNTAGGED = 0x2, 0x4
#: ``lo``'s index in every namespace (LOOPBACK_IFINDEX; the kernel asserts it when creating lo).
LOOPBACK_INDEX = 1

_NO_VLAN_FILTERING = "VLAN filtering is not available in this kernel (CONFIG_BRIDGE_VLAN_FILTERING)"


def _error(code: int, what: str = "") -> LinkError:
    text = os.strerror(code)
    return LinkError(code, f"{what}: {text}" if what else text)


def call(method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """One pyroute2 request, with a kernel error raised as :class:`LinkError`: the one place
    pyroute2's errors are translated (:mod:`.addressing`, :mod:`.routing`, :mod:`.tc` and
    :mod:`.conntrack` send theirs through it)."""
    try:
        reply = method(*args, **kwargs)
    except NetlinkError as e:
        if changes.log.isEnabledFor(DEBUG):
            changes.netlink(method, args, kwargs, e.code)
        raise _error(e.code) from None
    if changes.log.isEnabledFor(DEBUG):
        changes.netlink(method, args, kwargs)
    return reply


class _macvlan_data(macvx_data):  # type: ignore[misc]  # pyroute2's classes are untyped (Any)
    """pyroute2's macvlan attributes plus IFLA_MACVLAN_BC_QUEUE_LEN (Linux 5.11), which it lacks."""

    nla_map = (
        *macvx_data.nla_map,
        ("IFLA_MACVLAN_BC_QUEUE_LEN", "uint32"),
        ("IFLA_MACVLAN_BC_QUEUE_LEN_USED", "uint32"),
    )
    # A subclass inherits pyroute2's "nla_map compiled" mark: had macvx_data (macvtap's) been
    # used first, this class would use macvx_data's tables and drop the two attributes above.
    _nlmsg_base__compiled_nla = False

    class mode(nlmsg_atoms.uint32):  # type: ignore[misc]  # pyroute2's classes are untyped (Any)
        value_map = {0: "none", 1: "private", 2: "vepa", 4: "bridge", 8: "passthru", 16: "source"}


# pyroute2's link kinds are process-wide: registered once, with the module that sends them.
ifinfmsg.ifinfo.register_link_kind(module={"macvlan": _macvlan_data})


@contextmanager
def iproute() -> Iterator[IPRoute]:
    """An ``IPRoute`` in the calling thread's current namespace.

    Opening one costs ~0.3-0.7 ms (more in a thread that never had one: pyroute2 makes it an
    asyncio loop), so a long-lived thread keeps one for its current namespace: the main thread
    (the runtime calls plugins from the caller's own thread) and threads that called
    :func:`keep_iproutes` (``pycni serve``'s workers). It is replaced when the thread uses
    another namespace (until then it keeps the old one alive; a block nested in another
    namespace gets its own instead); the main thread's is closed at exit. Any other thread,
    whose lifetime is unknown here (netns workers, pools), gets one per block.
    """
    kept = _kept_iproute() if keeps_sockets() else None
    if kept is not None:
        _local.lent += 1
        try:
            yield kept
        finally:
            _local.lent -= 1
        return
    ipr = IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


def keep_iproutes() -> None:
    """Let the calling thread, which must outlive its :func:`iproute` blocks and run nothing but
    them there, keep one ``IPRoute`` between blocks, as the main thread does."""
    _local.keeps = True


class _Kept(threading.local):
    keeps = False
    kept: tuple[tuple[int, int, int], IPRoute] | None = None  # (pid, netns dev, ino), its IPRoute
    lent = 0  # open blocks using kept


_local = _Kept()


def keeps_sockets() -> bool:
    """Whether the calling thread keeps its netlink sockets between blocks (see :func:`iproute`):
    never while it only visits a namespace (:func:`pycni.netns.visiting`)."""
    if netns.visiting():
        return False
    return _local.keeps or threading.current_thread() is threading.main_thread()


def namespace_key() -> tuple[int, int, int]:
    """(pid, netns dev, netns inode) of the calling thread: what a kept socket belongs to."""
    return (os.getpid(), *netns.own_identity())


def _kept_iproute() -> IPRoute | None:
    key = namespace_key()
    if _local.kept is None or _local.kept[0] != key:
        if _local.lent:
            return None
        _close_kept()
        _local.kept = (key, IPRoute())
    return _local.kept[1]


@atexit.register
def _close_kept() -> None:
    """Close the calling thread's kept ``IPRoute`` (at exit: the main thread's)."""
    kept = _local.kept
    if kept is not None and kept[0][0] == os.getpid():  # a forked child leaves the parent's alone
        kept[1].close()
    _local.kept = None


# --- links --------------------------------------------------------------------------------------


@attrs.frozen
class Link:
    index: int
    name: str
    mac: str
    kind: str
    flags: int
    mtu: int
    master: int
    peer_index: int
    operstate: str
    txqlen: int = 0
    #: IFLA_LINK_NETNSID: the id, in this link's namespace, of the one ``peer_index`` is in
    #: (``None``: the same namespace as this link).
    peer_netnsid: int | None = None

    @property
    def up(self) -> bool:
        return bool(self.flags & IFF_UP)

    @property
    def promisc(self) -> bool:
        return bool(self.flags & IFF_PROMISC)


def _link(msg: Any) -> Link:
    """The :class:`Link` of an RTM_NEWLINK message: the attributes listed in one pass, and only
    the ones read decoded (pyroute2 decodes an attribute when its value is asked for; its
    ``msg.get`` walks the ~60 attributes each time)."""
    slots: dict[str, Any] = {}
    for slot in msg["attrs"]:
        slots.setdefault(slot.name, slot)

    def value(name: str, default: Any) -> Any:
        slot = slots.get(name)
        found = slot.get_value() if slot is not None else None
        return default if found is None else found

    info = value("IFLA_LINKINFO", None)
    return Link(
        index=msg["index"],
        name=value("IFLA_IFNAME", ""),
        mac=value("IFLA_ADDRESS", ""),
        kind=(info.get_attr("IFLA_INFO_KIND") if info is not None else None) or "",
        flags=msg["flags"],
        mtu=value("IFLA_MTU", 0),
        master=value("IFLA_MASTER", 0),
        peer_index=value("IFLA_LINK", 0),
        operstate=value("IFLA_OPERSTATE", "UNKNOWN"),
        txqlen=value("IFLA_TXQLEN", 0),
        peer_netnsid=value("IFLA_LINK_NETNSID", None),
    )


# linux/if_link.h: the attributes a Link reads, by number (pyroute2's tables; names without IFLA_)
_IFLA = {name[5:]: number for number, (name, *_) in enumerate(ifinfmsg.nla_map)}
_READ = frozenset(_IFLA[n] for n in "ADDRESS IFNAME MTU LINK MASTER TXQLEN OPERSTATE LINKINFO LINK_NETNSID".split())
_INFO_KIND = ifinfmsg.ifinfo.nla_map.index(("IFLA_INFO_KIND", "asciiz"))
_IFINFOMSG = struct.Struct("=16xBxHiII")  # struct nlmsghdr, struct ifinfomsg: family, type, index, flags, change
_U32, _S32 = struct.Struct("=I"), struct.Struct("=i")


def _text(payload: memoryview | None) -> str:
    """A string attribute as pyroute2's ``asciiz`` reads it; "" when there is none."""
    return bytes(payload).strip(b"\0").decode("utf-8", "replace") if payload is not None else ""


def _link_of(data: bytes) -> Link:
    """The :class:`Link` of one RTM_NEWLINK message (its bytes, header included), reading only
    the attributes a :class:`Link` holds: what :func:`_link` makes of pyroute2's decoding of
    the same message (a test compares them), without decoding the other ~35 attributes."""
    _, _, index, flags, _ = _IFINFOMSG.unpack_from(data)
    found = batch.attributes(data, _IFINFOMSG.size, _READ)
    names = "ADDRESS LINKINFO OPERSTATE LINK_NETNSID MTU MASTER LINK TXQLEN".split()
    mac, info, state, nsid, *numbers = (found.get(_IFLA[n]) for n in names)
    mtu, master, peer, txqlen = (int(_U32.unpack_from(p)[0]) if p is not None else 0 for p in numbers)
    return Link(
        index=index,
        name=_text(found.get(_IFLA["IFNAME"])),
        # pyroute2's l2addr: the first 6 bytes (every link read here is an Ethernet one)
        mac=":".join(f"{b:02x}" for b in mac[:6]) if mac is not None else "",
        kind=_text(batch.attributes(info, 0, (_INFO_KIND,)).get(_INFO_KIND) if info is not None else None),
        flags=flags,
        mtu=mtu,
        master=master,
        peer_index=peer,
        operstate=state_by_code[state[0]] if state is not None else "UNKNOWN",
        txqlen=txqlen,
        peer_netnsid=_S32.unpack_from(nsid)[0] if nsid is not None else None,
    )


def _get(ipr: IPRoute, name: str | None, index: int | None) -> Any | None:
    """The RTM_GETLINK answer for a name or index, ``None`` if there is no such link."""
    try:
        msgs = call(ipr.link, "get", index=index) if index is not None else call(ipr.link, "get", ifname=name)
    except LinkError as e:
        if e.errno == errno.ENODEV:
            return None
        raise
    return msgs[0] if msgs else None


def get_link(ipr: IPRoute, name: str | None = None, *, index: int | None = None) -> Link | None:
    """The link by name or index, ``None`` if there is none."""
    msg = _get(ipr, name, index)
    return _link(msg) if msg is not None else None


def fetch_link(name: str | None = None, *, index: int | None = None) -> Link | None:
    """:func:`get_link` in the calling thread's namespace through :mod:`.batch`, for the hot
    path: ~0.05 ms, the answer read without pyroute2's decoding, where a request through
    ``IPRoute`` costs ~0.35 ms."""
    requests = batch.Requests()
    requests.link_get(index or 0, name if index is None else None)
    answer = requests.send()[0]
    if answer.error is not None:
        if answer.error.errno == errno.ENODEV:
            return None
        raise answer.error
    return _link_of(answer.raw[0]) if answer.raw else None


@attrs.frozen
class LinkInfo:
    """A link with what only some readers need: its alias (IFLA_IFALIAS) and its kind's own
    attributes (IFLA_INFO_DATA by name: ``IFLA_MACVLAN_MODE``, ``IFLA_VRF_TABLE``, ...)."""

    link: Link
    alias: str
    data: Mapping[str, Any]


def link_info(ipr: IPRoute, name: str | None = None, *, index: int | None = None) -> LinkInfo | None:
    """The link by name or index with its alias and kind data, ``None`` if there is none."""
    msg = _get(ipr, name, index)
    if msg is None:
        return None
    data = msg.get(("linkinfo", "data"))
    return LinkInfo(_link(msg), msg.get("ifalias") or "", dict(data["attrs"]) if data is not None else {})


def ifindex(name: str) -> int | None:
    """The index of link ``name`` in the calling thread's namespace, ``None`` if there is none.

    ``if_nametoindex`` is one ioctl: where only the index matters it spares a netlink socket
    and a decoded RTM_GETLINK reply (~0.6 ms together with pyroute2).
    """
    try:
        return socket.if_nametoindex(name)
    except OSError:
        return None


# linux/sockios.h; struct ifreq (linux/if.h): the name, then a 24-byte union whose ifr_flags is a short
SIOCGIFFLAGS = 0x8913
_IFREQ_FLAGS = struct.Struct("=16sH22x")


def flags_of(name: str) -> int | None:
    """The ``IFF_*`` flags of link ``name`` in the calling thread's namespace (their low 16 bits),
    ``None`` if there is none: one ``SIOCGIFFLAGS`` ioctl, as :func:`ifindex` is one, where a
    decoded RTM_GETLINK reply costs ~0.3 ms. For the flags set on the link (``IFF_UP``): the
    ones the kernel derives (``IFF_RUNNING``) lag behind what netlink reports (see
    :func:`wait_oper_up`)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            answer = fcntl.ioctl(sock, SIOCGIFFLAGS, _IFREQ_FLAGS.pack(name.encode(), 0))
        except OSError as e:
            if e.errno == errno.ENODEV:
                return None
            raise
    flags: int = _IFREQ_FLAGS.unpack(answer)[1]
    return flags


def dump_links(ipr: IPRoute) -> list[Link]:
    return [_link(m) for m in call(ipr.link, "dump")]


def netnsid(ipr: IPRoute, ns_fd: int) -> int | None:
    """The id the calling thread's namespace gives namespace ``ns_fd`` (as a :attr:`Link.peer_netnsid`
    there would name it); ``None`` if it gives that namespace none."""
    reply = call(ipr.get_netnsid, fd=ns_fd)
    nsid = reply.get("nsid") if reply else None
    # pyroute2 reads NETNSA_NSID unsigned: NETNSA_NSID_NOT_ASSIGNED (-1) comes out as 2**32 - 1.
    if not isinstance(nsid, int) or nsid >= 2**31:
        return None
    return nsid


def random_mac() -> str:
    """A random locally administered unicast MAC, like the kernel's ``eth_random_addr``."""
    b = bytearray(secrets.token_bytes(6))
    b[0] = (b[0] & 0xFE) | 0x02
    return ":".join(f"{x:02x}" for x in b)


def random_veth_name() -> str:
    return "veth" + secrets.token_hex(4)


def ensure_bridge(
    ipr: IPRoute,
    name: str,
    *,
    mtu: int = 0,
    vlan_filtering: bool = False,
    mac: Callable[[], str | None] | None = None,
) -> tuple[Link, bool]:
    """The bridge ``name``, created if missing (a concurrent creator's EEXIST is fine).

    Returns the link and whether this call created it. An existing bridge's MTU and VLAN
    filtering are left as they are, as the reference plugin does. A kernel without VLAN
    filtering refuses the whole request, so nothing is left behind. A new bridge gets the MAC
    ``mac`` gives (asked only then; default, or ``None`` from it: a random one).
    """
    link = fetch_link(name)
    created = False
    if link is None:
        # An explicit MAC at creation makes it "set", so the kernel never swaps it for the lowest
        # port's MAC as ports come and go: every ADD sees, and reports, the same bridge MAC.
        address = (mac() if mac is not None else None) or random_mac()
        spec: dict[str, Any] = {"ifname": name, "kind": "bridge", "address": address}
        if vlan_filtering:
            spec["br_vlan_filtering"] = 1
        if mtu > 0:
            spec["mtu"] = mtu
        try:
            call(ipr.link, "add", **spec)
            created = True
        except LinkError as e:
            if vlan_filtering and e.errno == errno.EOPNOTSUPP:
                raise _error(e.errno, _NO_VLAN_FILTERING) from None
            if e.errno != errno.EEXIST:
                raise
        link = fetch_link(name)
        if link is None:
            raise _error(errno.ENODEV, f"bridge {name!r} vanished right after creation")
    if link.kind != "bridge":
        raise LinkError(errno.EEXIST, f'"{name}" already exists but is not a bridge')
    return link, created


def add_veth(
    host_name: str,
    host_mac: str,
    *,
    peer_name: str,
    peer_netns_fd: int,
    peer_mac: str | None,
    mtu: int,
    master: int | None,
) -> None:
    """One RTM_NEWLINK (one send of :mod:`.batch`), in the calling thread's namespace: a veth
    whose host end is UP (and enslaved to ``master``) here and whose peer is created directly in
    the namespace ``peer_netns_fd`` (never moved: a move costs an extra round of namespace work
    and notifications)."""
    peer: dict[str, Any] = {"ifname": peer_name, "net_ns_fd": peer_netns_fd, "address": peer_mac}
    requests = batch.Requests()
    requests.veth_add({"ifname": host_name, "address": host_mac}, peer, master=master, mtu=mtu)
    requests.send()[0].check()


def add_link(
    ipr: IPRoute, name: str, kind: str, *, mtu: int = 0, txqlen: int | None = None, up: bool = False, **extra: Any
) -> None:
    """One RTM_NEWLINK for a device of ``kind``; ``extra`` are further pyroute2 link attributes
    (``link`` for a master, ``net_ns_fd``, ``address``, the kind's own such as ``vlan_id``)."""
    spec: dict[str, Any] = {"ifname": name, "kind": kind, **extra}
    if mtu > 0:
        spec["mtu"] = mtu
    if txqlen is not None:
        spec["txqlen"] = txqlen
    if up:
        spec["state"] = "up"
    call(ipr.link, "add", **spec)


def set_up(ipr: IPRoute, index: int, *, promisc: bool = False) -> None:
    flags = IFF_UP | (IFF_PROMISC if promisc else 0)
    call(ipr.link, "set", index=index, flags=flags, change=flags)


def set_down(ipr: IPRoute, index: int) -> None:
    call(ipr.link, "set", index=index, state="down")


def set_link(ipr: IPRoute, index: int, **spec: Any) -> None:
    """One RTM_SETLINK with pyroute2's link attributes (``mtu``, ``address``, ``txqlen``, ...)."""
    call(ipr.link, "set", index=index, **spec)


def set_master(ipr: IPRoute, index: int, master: int) -> None:
    """Enslave the link to ``master`` (a bridge) and bring it up."""
    call(ipr.link, "set", index=index, master=master, state="up")


def set_brport(ipr: IPRoute, index: int, *, hairpin: bool = False, isolated: bool = False) -> None:
    """Bridge port flags: only those set to True are written."""
    flags = {k: 1 for k, on in (("mode", hairpin), ("isolated", isolated)) if on}  # IFLA_BRPORT_MODE = hairpin
    if flags:
        call(ipr.brport, "set", index=index, **flags)


def set_port_vlans(ipr: IPRoute, index: int, *, pvid: int, tagged: tuple[int, ...], keep_default: bool) -> None:
    """Port VLAN membership: ``pvid`` (PVID, untagged; 0 = none) and ``tagged`` vids.

    Unless ``keep_default``, the default VLAN 1 a new port starts with is removed first.
    """
    try:
        if not keep_default:
            try:
                call(ipr.vlan_filter, "del", index=index, vlan_info={"vid": 1})
            except LinkError as e:
                if e.errno not in (errno.ENOENT, errno.EINVAL):
                    raise
        if pvid:
            flags = BRIDGE_VLAN_INFO_PVID | BRIDGE_VLAN_INFO_UNTAGGED
            call(ipr.vlan_filter, "add", index=index, vlan_info={"vid": pvid, "flags": flags})
        for vid in tagged:
            if vid != pvid:
                call(ipr.vlan_filter, "add", index=index, vlan_info={"vid": vid})
    except LinkError as e:
        if e.errno == errno.EOPNOTSUPP:
            raise _error(e.errno, _NO_VLAN_FILTERING) from None
        raise


def delete_link(name: str, timeout: float = 10.0) -> None:
    """Delete link ``name`` in the calling thread's namespace (a missing one is fine).

    Returns once the device is unlisted (gone from its namespace, its name free; a veth's peer
    goes with it). The request is sent by a helper thread, which inherits the calling thread's
    namespace as every new thread does, and which closes its socket and ends when the kernel
    acknowledges; only a kernel error other than "no such device" reaches the caller. The
    caller watches the name with :func:`ifindex`.
    """
    done = threading.Event()
    outcome: list[Exception | None] = []
    # In the caller's context: its log records carry the caller's attachment.
    run = contextvars.copy_context().run
    threading.Thread(target=run, args=(_delete, name, outcome, done), name=f"dellink:{name}", daemon=True).start()
    deadline = time.monotonic() + timeout
    delay = 0.0003  # unlisting takes about a millisecond: look soon, then back off
    while not done.wait(delay):
        if ifindex(name) is None:
            return
        if time.monotonic() >= deadline:
            raise _error(errno.ETIMEDOUT, f"timed out deleting link {name!r}")
        delay = min(delay * 2, 0.05)
    error = outcome[0]
    if error is not None and not (isinstance(error, LinkError) and error.errno == errno.ENODEV):
        raise error


def _delete(name: str, outcome: list[Exception | None], done: threading.Event) -> None:
    try:
        requests = batch.Requests()  # one send: no IPRoute (and asyncio loop) for a thread about to end
        requests.link_del(name)
        requests.send()[0].check()
        outcome.append(None)
    except Exception as e:  # handed over to the caller, which raises it
        outcome.append(e)
    finally:
        done.set()


# --- waiting ------------------------------------------------------------------------------------


def wait_oper_up(name: str, timeout: float = 2.5) -> str:
    """Poll until the link's operstate is UP; returns the last state seen.

    A fresh bridge port turns UP when its veth peer comes up, a workqueue hop later: usually
    within a millisecond, so the first sleeps are short. Read through netlink, whose answer
    settles the link's pending state change first (``linkwatch_sync_dev``): the ioctl's
    ``IFF_RUNNING`` (:func:`flags_of`) still says running for a while after a veth without a
    carrier is set UP.
    """
    deadline = time.monotonic() + timeout
    delay = 0.0002
    while True:
        link = fetch_link(name)
        state = link.operstate if link else "NOTFOUND"
        if state == "UP" or time.monotonic() >= deadline:
            return state
        time.sleep(delay)
        delay = min(delay * 2, 0.25)
