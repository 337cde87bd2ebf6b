"""The failures of Nomad's CNI configurator, as :class:`~pycni.errors.CNIError` subclasses.

Messages are Nomad's own (``failed to configure network: …``, ``network namespace already exists
but was misconfigured: …``) so logs read the same; the code of a wrapped CNI error is kept.
"""

from __future__ import annotations

from typing import Any

from ..errors import CNIError, ConfigError, ErrorCode, ResultError

__all__ = [
    "DecodeError",
    "ConfLoadError",
    "TransparentProxyError",
    "InitError",
    "SetupError",
    "CheckFailedError",
    "ForwardingRulesError",
    "StatusError",
    "CleanupError",
    "CHECK_FAILED",
]

CHECK_FAILED = "network namespace already exists but was misconfigured"


def _code_of(cause: BaseException | None) -> int:
    return cause.code if isinstance(cause, CNIError) else ErrorCode.UNKNOWN


class DecodeError(CNIError):
    """Allocation, node or result JSON that does not have Nomad's shape; ``path`` names the field."""

    default_code = ErrorCode.DECODING_FAILURE

    def __init__(self, path: str, problem: str, **kw: Any) -> None:
        self.path = path
        super().__init__(f"{path}: {problem}" if path else problem, **kw)


class ConfLoadError(ConfigError):
    """No usable network config of that name in the CNI config dir (Nomad's ``loadCNIConf``)."""


class TransparentProxyError(ConfigError):
    """The transparent-proxy settings cannot be built (e.g. an unparsable default outbound port)."""


class _Wrapping(CNIError):
    """``<prefix>: <cause>``, keeping the cause's CNI code and the cause itself."""

    prefix = ""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause
        super().__init__(f"{self.prefix}: {cause}", code=_code_of(cause))


class InitError(_Wrapping):
    """The client could not be loaded (or reported a STATUS failure) before ADD."""

    prefix = "cni not initialized"


class SetupError(_Wrapping):
    """Every ADD attempt failed; ``cause`` is the *first* failure, as Nomad reports it."""

    prefix = "failed to configure network"


class CheckFailedError(_Wrapping):
    """CHECK of an existing namespace failed: the caller should destroy and recreate it once."""

    prefix = CHECK_FAILED


class ForwardingRulesError(_Wrapping):
    """The bridge's admin-chain forwarding rule could not be ensured (before ADD or CHECK)."""

    prefix = "failed to initialize table forwarding rules"


class StatusError(ResultError):
    """A go-cni result with no interface or no address (``failed to configure network: …``)."""


class CleanupError(CNIError):
    """Forced cleanup could not finish; ``removed`` lists what it did remove before failing."""

    default_code = ErrorCode.IO_FAILURE

    def __init__(self, msg: str, details: str = "", *, removed: tuple[str, ...] = (), **kw: Any) -> None:
        self.removed = removed
        super().__init__(msg, details, **kw)
