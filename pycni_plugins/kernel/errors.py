"""The errors of the kernel helpers, without pyroute2 (importing it costs ~130 ms): a kernel
refusal (:class:`LinkError`), a plugin's internal CNI error (:func:`fail`, :func:`failing`
for a refusal) and the namespace error DEL forgives (:func:`netns_gone`)."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

from pycni import netns
from pycni.errors import CNIError, ErrorCode

__all__ = ["LinkError", "fail", "failing", "netns_gone"]


class LinkError(OSError):
    """A netlink request failed; ``errno`` is the kernel's."""


def fail(msg: str, details: str = "") -> CNIError:
    """A plugin-internal error: code 999 with the message as text, as Go's skel reports one."""
    return CNIError(msg, details, code=ErrorCode.INTERNAL)


@contextmanager
def failing(what: str) -> Iterator[None]:
    """A kernel refusal in the block as the plugin's error, worded as the reference plugins word
    theirs: ``<what>: <the kernel's text>`` (code 999). Refusals a plugin handles otherwise are
    caught inside the block."""
    try:
        yield
    except LinkError as e:
        raise fail(f"{what}: {e.strerror}") from e


def netns_gone(e: BaseException) -> bool:
    """Whether ``e`` says the container's namespace is gone: its path no longer exists, or no
    longer is a network namespace (the empty file a bind mount left on a /run that survived a
    reboot). DEL treats both as "nothing left in there to delete"."""
    return isinstance(e, netns.NetnsError) and e.errno in (errno.ENOENT, errno.EINVAL)
