"""CNI result wire models for every spec version, their decoding and conversion.

- :class:`Result` (1.0.0/1.1.0), :class:`Result040` (0.3.0/0.3.1/0.4.0) and :class:`Result020`
  (0.1.0/0.2.0): frozen attrs models; ``Model.from_json(obj)`` decodes, ``model.to_json()`` gives
  the dict Go would emit for that version.
- :func:`parse_result` decodes untrusted plugin output with libcni's version fixup, and raises
  only :class:`~pycni.errors.ResultError`.
- :class:`PortMapping`: one ``portMappings`` capability entry (runtime → portmap plugin).
- :func:`convert` turns any result into any version with libcni's (sometimes lossy) rules.
"""

from ._common import DNS, IPAddress, IPInterface, Route
from .convert import AnyResult, convert
from .current import Interface, IPConfig, Result
from .parse import parse_result
from .ports import PortMapping
from .v020 import IPConfig020, Result020
from .v040 import IPConfig040, Result040

__all__ = [
    "AnyResult",
    "DNS",
    "IPAddress",
    "IPConfig",
    "IPConfig020",
    "IPConfig040",
    "IPInterface",
    "Interface",
    "PortMapping",
    "Result",
    "Result020",
    "Result040",
    "Route",
    "convert",
    "parse_result",
]
