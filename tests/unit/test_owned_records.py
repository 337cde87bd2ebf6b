"""The link records' on-disk format: what earlier versions wrote is read, and written back byte
for byte (a state dir outlives an upgrade); a damaged field reads as absent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pycni.sdk import Attachment
from pycni_plugins.kernel import owned

ATT = {"network": "net1", "container_id": "c1", "ifname": "eth0"}
LINK = {"netns": 4026532301, "path": "/run/netns/c1", "index": 7, "mac": "0a:58:0a:00:00:05"}
VETH_RECORDS = [
    {"attachment": ATT, "bridge": "cni0", "bridge_mac": "0a:58:0a:00:00:01", "host": "veth1a2b3c4d"},
    {"attachment": ATT, "bridge": "cni0", "host": None},  # a failed bridge ADD's
    {"attachment": ATT, "host": "veth1a2b3c4d"},  # ptp's
    {"attachment": ATT, "host": None},
]
LINK_RECORDS = [
    {"attachment": ATT, "link": LINK},
    {"attachment": ATT, "link": None},
    {"attachment": ATT, "device": "hd0", "addresses": ["198.18.0.2/24"], "up": True, "link": LINK},
]


def _bytes(data: object) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


@pytest.mark.parametrize("data", VETH_RECORDS)
def test_a_veth_record_reads_and_writes_back_the_same_bytes(data: dict[str, object]) -> None:
    record = owned.VethRecord.from_json(data)
    assert record is not None and record.attachment == Attachment("net1", "c1", "eth0")
    assert _bytes(record.to_json()) == _bytes(data)


@pytest.mark.parametrize("data", LINK_RECORDS)
def test_a_link_record_reads_and_writes_back_the_same_bytes(data: dict[str, object]) -> None:
    record = owned.LinkRecord.from_json(data)
    assert record is not None
    assert _bytes(record.to_json()) == _bytes(data)


def test_the_store_files_a_record_under_its_attachment_key(tmp_path: Path) -> None:
    records = owned.VethRecords("bridge", str(tmp_path))
    record = owned.VethRecord.from_json(VETH_RECORDS[0])
    assert record is not None
    records.put(record)
    key = record.attachment.key
    assert (tmp_path / "bridge" / key).read_bytes() == _bytes(VETH_RECORDS[0])
    assert records.record(key) == record and records.records() == [record]


def test_a_link_record_older_than_gc_names_no_path() -> None:
    old = {"attachment": ATT, "link": {k: v for k, v in LINK.items() if k != "path"}}
    record = owned.LinkRecord.from_json(old)
    assert record is not None and record.link is not None and record.link.path == ""


def test_damaged_fields_read_as_absent_and_a_non_object_is_no_record() -> None:
    veth = owned.VethRecord.from_json({"attachment": {"network": 5}, "host": 3, "bridge": None})
    assert veth == owned.VethRecord(Attachment("", "", ""))
    link = owned.LinkRecord.from_json({"attachment": ATT, "link": {**LINK, "index": "7"}, "device": "hd0"})
    assert link is not None and link.link is None and link.moved == owned.MovedDevice("hd0")
    assert owned.VethRecord.from_json([]) is None and owned.LinkRecord.from_json(None) is None


def test_a_store_takes_only_its_own_kinds(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        owned.VethRecords("macvlan", str(tmp_path))
    with pytest.raises(ValueError):
        owned.LinkRecords("ptp", str(tmp_path))


@pytest.mark.parametrize("torn", [b"", b'{"attachment":{"network":"ne', b"\x00" * 64], ids=["empty", "cut", "zeros"])
def test_a_record_a_power_cut_left_empty_or_torn_reads_as_none(tmp_path: Path, torn: bytes) -> None:
    # State records are not fsync'd (kernel/state.py): after a power cut one may be any of these,
    # and the DEL that follows the reboot must read it as no record rather than fail on it.
    from pycni_plugins.kernel.nft import ownership

    att = Attachment("net1", "c1", "eth0")
    veths = owned.VethRecords("bridge", str(tmp_path))
    veths.put(owned.VethRecord(att, "veth1a2b3c4d"))
    nft = ownership.records(str(tmp_path))
    nft.store(ownership.record_name(att, "masq"), {"elements": []})
    (tmp_path / "bridge" / att.key).write_bytes(torn)
    (tmp_path / "nft" / ownership.record_name(att, "masq")).write_bytes(torn)
    assert veths.record(att.key) is None and veths.records() == []
    assert ownership.load(nft, att, "masq") is ownership.TORN  # its DEL searches: see test_gc.py
