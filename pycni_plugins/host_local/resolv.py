"""``resolvConf``: a resolv.conf read as the reference's ``parseResolvConf`` reads it."""

from __future__ import annotations

from pycni.types import DNS

from ._errors import fail, strerror

__all__ = ["parse_resolv_conf"]


def parse_resolv_conf(path: str) -> DNS:
    """``nameserver``/``domain``/``search``/``options`` of a resolv.conf, as the result's DNS."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except IsADirectoryError:
        raise fail(f"read {path}: is a directory") from None
    except OSError as e:
        raise fail(f"open {path}: {strerror(e)}") from None
    except ValueError:
        raise fail(f"open {path}: invalid argument") from None
    nameservers: list[str] = []
    search: list[str] = []
    options: list[str] = []
    domain = ""
    for line in text.split("\n"):
        fields = line.split()
        if len(fields) < 2 or fields[0][0] in "#;":
            continue
        if fields[0] == "nameserver":
            nameservers.append(fields[1])
        elif fields[0] == "domain":
            domain = fields[1]
        elif fields[0] == "search":
            search += fields[1:]
        elif fields[0] == "options":
            options += fields[1:]
    return DNS(nameservers, domain, search, options)
