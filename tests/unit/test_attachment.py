"""One attachment identity for the runtime and the plugins, and one valid-attachments entry."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from pycni.config import NetworkConfig
from pycni.errors import CNIError, ErrorCode
from pycni.runtime_conf import build_config
from pycni.sdk import Attachment, GCAttachment, PluginRequest
from pycni_plugins import _common
from pycni_plugins.kernel import nft


def test_the_key_is_the_one_the_kernel_records_are_filed_under() -> None:
    # Records written before the move must still be found: the digest may not change.
    want = hashlib.sha256(b"net1\0c1\0eth0").hexdigest()[:20]
    assert Attachment("net1", "c1", "eth0").key == want
    spaced = Attachment("net1", "c 1", "eth0")
    assert nft.comment(spaced, "portmap") == f"{spaced.key} portmap net1 c_1 eth0"


def test_what_the_runtime_emits_for_gc_is_what_a_plugin_decodes() -> None:
    valid = [GCAttachment("c1", "eth0"), GCAttachment("c2", "net1")]
    config = build_config(
        NetworkConfig(raw={"type": "x"}), name="n", cni_version="1.1.0", valid_attachments=valid, gc=True
    )
    request = PluginRequest("GC", config)
    assert _common.valid_attachments(request) == {("c1", "eth0"), ("c2", "net1")}
    assert [GCAttachment.from_json(e).on("n") for e in config["cni.dev/valid-attachments"]] == [
        Attachment("n", "c1", "eth0"),
        Attachment("n", "c2", "net1"),
    ]


@pytest.mark.parametrize("entry", [None, "c1", {"ifname": "eth0"}, {"containerID": 1}])
def test_a_bad_valid_attachments_entry_is_a_code_999_error(entry: Any) -> None:
    with pytest.raises(CNIError, match="invalid cni.dev/valid-attachments entry") as caught:
        GCAttachment.from_json(entry)
    assert caught.value.code == ErrorCode.INTERNAL


def test_a_non_string_ifname_decodes_as_empty() -> None:
    assert GCAttachment.from_json({"containerID": "c", "ifname": 3}) == GCAttachment("c", "")
