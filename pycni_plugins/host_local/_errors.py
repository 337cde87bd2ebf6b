"""host-local's errors: the Go plugin returns plain errors, which skel reports as code 999 with
msg = the text, so every one here is code 999 with the Go text."""

from __future__ import annotations

import errno
import json
import os

from pycni.errors import CNIError, ConfigError, ErrorCode

__all__ = ["config_fail", "fail", "go_quote", "os_fail", "refuse_symlink", "strerror"]


def fail(msg: str) -> CNIError:
    return CNIError(msg, code=ErrorCode.INTERNAL)


def config_fail(msg: str) -> ConfigError:
    return ConfigError(msg, code=ErrorCode.INTERNAL)


def go_quote(text: str) -> str:
    """Go's ``%q`` for the printable strings CNI_ARGS carry."""
    return json.dumps(text, ensure_ascii=False)


def strerror(exc: OSError) -> str:
    """Go's lower-case errno text (``no such file or directory``)."""
    text = os.strerror(exc.errno) if exc.errno else str(exc)
    return text[:1].lower() + text[1:]


def refuse_symlink(path: str) -> CNIError:
    return fail(f"{path} is a symbolic link, refusing to follow it")


def os_fail(op: str, path: str, exc: OSError) -> CNIError:
    if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
        return refuse_symlink(path)
    return fail(f"{op} {path}: {strerror(exc)}")
