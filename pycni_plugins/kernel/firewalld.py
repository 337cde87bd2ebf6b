"""firewalld over its D-Bus API (jeepney, pure Python): is it running, a zone's sources added,
removed and listed, the default zone, and its ``Reloaded`` signal.

The bus is the system bus as the caller sees it: ``$DBUS_SYSTEM_BUS_ADDRESS`` when set (in the
plugin invocation's environment; under ``pycni serve``, whose shims forward only ``CNI_*`` and
``PYCNI_*``, the daemon's), else
``unix:path=/run/dbus/system_bus_socket`` resolved in the calling process's mount namespace (a
path socket: the network namespace does not matter). No ``firewall-cmd`` is exec'd. Sources are
what the Go firewall plugin adds: the container's address as a host prefix (``/32``, ``/128``).

Every call opens one connection for one operation (:func:`session`); errors come back as
:class:`FirewalldError` (``unavailable`` when there is no bus or no firewalld on it).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from . import changes

__all__ = [
    "SYSTEM_BUS",
    "FirewalldError",
    "Session",
    "bus_address",
    "session",
    "source_of",
    "available",
    "Reloads",
    "wait_reloaded",
]

SYSTEM_BUS = "unix:path=/run/dbus/system_bus_socket"
_NAME = "org.fedoraproject.FirewallD1"
_PATH = "/org/fedoraproject/FirewallD1"
_ZONE = "org.fedoraproject.FirewallD1.zone"
_TIMEOUT = 10.0


class FirewalldError(Exception):
    """A failed firewalld call: ``code`` is firewalld's error name (``ZONE_ALREADY_SET``,
    ``UNKNOWN_SOURCE``, ``INVALID_ZONE``, ...) or ``unavailable``."""

    def __init__(self, msg: str, code: str = "") -> None:
        super().__init__(msg)
        self.msg = msg
        self.code = code

    @property
    def unavailable(self) -> bool:
        return self.code == "unavailable"


def bus_address(env: Mapping[str, str] | None = None) -> str:
    """The system bus's address in environment ``env`` (default: the process's)."""
    return (os.environ if env is None else env).get("DBUS_SYSTEM_BUS_ADDRESS") or SYSTEM_BUS


def source_of(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """A container address as a zone source, as the Go plugin writes it."""
    return f"{address}/{address.max_prefixlen}"


class Session:
    """One connection to firewalld over the system bus."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def _call(self, interface: str, method: str, signature: str = "", body: tuple[Any, ...] = ()) -> tuple[Any, ...]:
        from jeepney import DBusAddress, MessageType, new_method_call

        addr = DBusAddress(_PATH, bus_name=_NAME, interface=interface)
        try:
            reply = self._conn.send_and_get_reply(new_method_call(addr, method, signature, body), timeout=_TIMEOUT)
        except (OSError, TimeoutError) as e:
            raise FirewalldError(f"firewalld {method}: {e}", "unavailable") from e
        if reply.header.message_type == MessageType.error:
            from jeepney import HeaderFields

            text = str(reply.body[0]) if reply.body else ""
            name = str(reply.header.fields.get(HeaderFields.error_name, ""))
            if name.startswith("org.freedesktop.DBus.Error."):  # no firewalld on the bus, or a denial
                raise FirewalldError(f"firewalld {method}: {text or name}", "unavailable")
            code = text.split(":", 1)[0].strip() if ":" in text else name
            raise FirewalldError(text or name, code)
        return tuple(reply.body)

    def state(self) -> str:
        """firewalld's ``state`` property (``RUNNING`` once it has applied its rules)."""
        from jeepney import DBusAddress, MessageType, Properties

        addr = DBusAddress(_PATH, bus_name=_NAME, interface=_NAME)
        try:
            reply = self._conn.send_and_get_reply(Properties(addr).get("state"), timeout=_TIMEOUT)
        except (OSError, TimeoutError) as e:
            raise FirewalldError(f"firewalld state: {e}", "unavailable") from e
        if reply.header.message_type == MessageType.error:
            raise FirewalldError(f"firewalld is not running: {reply.body[0] if reply.body else ''}", "unavailable")
        return str(reply.body[0][1])

    def default_zone(self) -> str:
        return str(self._call(_NAME, "getDefaultZone")[0])

    def sources(self, zone: str) -> list[str]:
        return [str(s) for s in self._call(_ZONE, "getSources", "s", (zone,))[0]]

    def zone_of_source(self, source: str) -> str:
        """The zone ``source`` is bound to; ``""`` when none."""
        return str(self._call(_ZONE, "getZoneOfSource", "s", (source,))[0])

    def add_source(self, zone: str, source: str) -> bool:
        """Bind ``source`` to ``zone`` (runtime configuration); False when it already was."""
        try:
            self._call(_ZONE, "addSource", "ss", (zone, source))
        except FirewalldError as e:
            if e.code == "ZONE_ALREADY_SET":
                return False
            raise
        changes.firewalld("addSource", zone, source)
        return True

    def remove_source(self, zone: str, source: str) -> bool:
        """Unbind ``source`` from ``zone``; False when it was not bound there (bound to another
        zone, to none, or the zone does not exist)."""
        try:
            self._call(_ZONE, "removeSource", "ss", (zone, source))
        except FirewalldError as e:
            if e.code in ("UNKNOWN_SOURCE", "ZONE_CONFLICT", "INVALID_ZONE"):
                return False
            raise
        changes.firewalld("removeSource", zone, source)
        return True

    def add_sources(self, zone: str, sources: Iterable[str]) -> list[str]:
        """Bind every source; the ones that were not bound yet."""
        return [s for s in sources if self.add_source(zone, s)]


@contextlib.contextmanager
def session(address: str | None = None) -> Iterator[Session]:
    """A connection to firewalld on the system bus (``address``: :func:`bus_address`), checked
    to be running; :class:`FirewalldError` ``unavailable`` when there is no bus or firewalld."""
    from jeepney.io.blocking import open_dbus_connection

    addr = address or bus_address()
    try:
        conn = open_dbus_connection(addr, auth_timeout=2.0)
    except (OSError, RuntimeError, ValueError) as e:  # no socket, refused, bad address, auth
        raise FirewalldError(f"cannot connect to the system bus at {addr}: {e}", "unavailable") from e
    try:
        s = Session(conn)
        state = s.state()
        if state != "RUNNING":
            raise FirewalldError(f"firewalld is {state}, not running", "unavailable")
        yield s
    finally:
        conn.close()


def available(address: str | None = None) -> bool:
    """Whether firewalld is running on the system bus."""
    try:
        with session(address):
            return True
    except FirewalldError:
        return False


class Reloads:
    """A subscription to firewalld's ``Reloaded`` signal on one connection (no signal is missed
    between two :meth:`wait` calls); a context manager."""

    def __init__(self, address: str | None = None) -> None:
        from jeepney import MatchRule, message_bus
        from jeepney.io.blocking import open_dbus_connection

        addr = address or bus_address()
        try:
            self._conn = open_dbus_connection(addr, auth_timeout=2.0)
        except (OSError, RuntimeError, ValueError) as e:
            raise FirewalldError(f"cannot connect to the system bus at {addr}: {e}", "unavailable") from e
        try:
            self._rule = MatchRule(type="signal", interface=_NAME, member="Reloaded", path=_PATH)
            self._conn.send_and_get_reply(message_bus.AddMatch(self._rule), timeout=_TIMEOUT)
            self._filter = self._conn.filter(self._rule)
            self._queue = self._filter.__enter__()
        except (OSError, TimeoutError) as e:
            self._conn.close()
            raise FirewalldError(f"cannot subscribe to firewalld's Reloaded signal: {e}", "unavailable") from e

    def wait(self, timeout: float | None = None) -> bool:
        """True when firewalld signalled ``Reloaded`` (since the last call), False on timeout;
        :class:`FirewalldError` ``unavailable`` when the bus went away."""
        try:
            self._conn.recv_until_filtered(self._queue, timeout=timeout)
        except TimeoutError:
            return False
        except (OSError, EOFError) as e:
            raise FirewalldError(f"the system bus went away: {e}", "unavailable") from e
        return True

    def close(self) -> None:
        self._filter.__exit__(None, None, None)
        self._conn.close()

    def __enter__(self) -> Reloads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_reloaded(address: str | None = None, timeout: float | None = None) -> bool:
    """Block until firewalld signals ``Reloaded`` (True) or ``timeout`` passes (False)."""
    with Reloads(address) as reloads:
        return reloads.wait(timeout)
