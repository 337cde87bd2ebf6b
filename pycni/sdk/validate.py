"""The names, IDs and interface names every path checks the same way (libcni's and skel's rules)."""

from __future__ import annotations

import re

from ..errors import ErrorCode, InvalidArgumentError

__all__ = [
    "NAME_PATTERN",
    "validate_network_name",
    "validate_container_id",
    "validate_ifname",
    "ifname_problem",
    "validate_attachment_key",
]

#: A network name and a container ID: ``[A-Za-z0-9][A-Za-z0-9_.-]*`` (libcni's ``utils.ValidateID``).
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_NAME_MAX = 255  # bytes in one file name (ext4, tmpfs, xfs, btrfs)


def validate_network_name(name: str) -> None:
    """Refuse names that are empty or could leave a path component (before they touch one)."""
    if not name:
        raise InvalidArgumentError("missing network name:", code=ErrorCode.INVALID_NETWORK_CONFIG)
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidArgumentError(
            "invalid characters found in network name", str(name), code=ErrorCode.INVALID_NETWORK_CONFIG
        )


def validate_container_id(container_id: str) -> None:
    """libcni's rule (missing: code 3; anything but ``[A-Za-z0-9][A-Za-z0-9_.-]*``: code 4)."""
    if not container_id:
        raise InvalidArgumentError("missing containerID", code=ErrorCode.UNKNOWN_CONTAINER)
    if not NAME_PATTERN.fullmatch(container_id):
        raise InvalidArgumentError("invalid characters in containerID", container_id)


def ifname_problem(ifname: str) -> tuple[str, str] | None:
    """What makes ``ifname`` no Linux interface name (IFNAMSIZ: 1..15 bytes, not ``.``/``..``,
    no ``/ :``, whitespace or NUL) as (message, details); None when it is one."""
    if not ifname:
        return "interface name is empty", ""
    if len(ifname.encode("utf-8", "surrogatepass")) > 15:
        return "interface name is too long", "interface name should be less than 16 characters"
    if ifname in (".", ".."):
        return "interface name is . or ..", ""
    if any(c in "/:" or c.isspace() or c == "\x00" for c in ifname):
        return "interface name contains / or : or whitespace characters", ""
    return None


def validate_ifname(ifname: str) -> None:
    """Refuse what :func:`ifname_problem` finds (code 4)."""
    problem = ifname_problem(ifname)
    if problem is not None:
        raise InvalidArgumentError(*problem)


def validate_attachment_key(network: str, container_id: str, ifname: str) -> None:
    """Container ID and ifname valid, and ``<network>-<containerID>-<ifname>`` (the cache file
    name; the longest name derived from an attachment) fits in one file name: otherwise an ADD
    would fail at its cache write after the plugins have run, and an ID too long for a file name
    is too long for every record keyed by it. Code 4, before anything changes."""
    validate_container_id(container_id)
    validate_ifname(ifname)
    if len(f"{network}-{container_id}-{ifname}".encode()) > _NAME_MAX:
        raise InvalidArgumentError(
            "containerID is too long",
            f"<network>-<containerID>-<ifname> must fit in {_NAME_MAX} bytes (a file name); "
            f"the containerID has {len(container_id)}",
        )
