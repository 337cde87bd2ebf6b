"""pycni: a pure-Python CNI runtime (libcni, go-cni, cnitool) and in-process plugin host."""

from ._version import __version__
from .errors import (
    CacheError,
    CNIError,
    ConfigError,
    ErrorCode,
    InvalidArgumentError,
    MultiError,
    NetworkNotFoundError,
    NoConfigsFoundError,
    PluginError,
    PluginNotFoundError,
    PluginTimeoutError,
    ResultError,
    VersionError,
)

__all__ = [
    "__version__",
    "CNIError",
    "CacheError",
    "ConfigError",
    "ErrorCode",
    "InvalidArgumentError",
    "MultiError",
    "NetworkNotFoundError",
    "NoConfigsFoundError",
    "PluginError",
    "PluginNotFoundError",
    "PluginTimeoutError",
    "ResultError",
    "VersionError",
]
