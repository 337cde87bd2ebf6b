"""The test image, made locally: busybox-static as a one-layer docker-archive (no registry).

Both clients load this format (``podman load``, ``ctr image import``). The layer is the whole
root filesystem: ``/bin/busybox`` and the applet links the tests use.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

__all__ = ["BUSYBOX", "write_busybox_archive"]

BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static
_APPLETS = ("sh", "ip", "ping", "sleep", "cat")
_DIRS = ("bin", "dev", "etc", "proc", "root", "sys", "tmp")


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, **fields: object) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    for key, value in fields.items():
        setattr(info, key, value)
    if data is not None:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _layer() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in _DIRS:
            _add(tar, name, type=tarfile.DIRTYPE, mode=0o755)
        _add(tar, "bin/busybox", BUSYBOX.read_bytes(), mode=0o755)
        for applet in _APPLETS:
            _add(tar, f"bin/{applet}", type=tarfile.SYMTYPE, linkname="busybox")
    return buf.getvalue()


def write_busybox_archive(path: Path, tag: str) -> None:
    """Write a docker-archive holding one image ``tag`` (linux/amd64, ``PATH=/bin``)."""
    layer = _layer()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in ((config_name, config), ("layer.tar", layer), ("manifest.json", manifest)):
            _add(tar, name, data, mode=0o644)
