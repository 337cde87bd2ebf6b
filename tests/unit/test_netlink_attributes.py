"""kernel.batch.attributes: the narrow reader of netlink attributes that fetch_link, route_oif
and addressing.of_link use instead of pyroute2's full decoding (tests/kernel/test_batch.py
compares them on the kernel's own messages)."""

from __future__ import annotations

import struct

from pycni_plugins.kernel import batch

NLA_F_NESTED = 1 << 15


def _nla(kind: int, payload: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def test_each_types_first_payload_is_read_past_padding_with_the_nested_flag_dropped() -> None:
    nested = _nla(1, b"veth\0")
    data = (
        b"\xaa" * 8 + _nla(3, b"eth0\0") + _nla(18 | NLA_F_NESTED, nested) + _nla(3, b"later\0") + _nla(4, b"\1\0\0\0")
    )
    found = batch.attributes(data, 8)
    assert sorted(found) == [3, 4, 18]
    assert bytes(found[3]) == b"eth0\0"  # the first of two, its padding left out
    assert bytes(batch.attributes(found[18], 0)[1]) == b"veth\0"
    assert struct.unpack("=I", found[4])[0] == 1


def test_a_truncated_or_malformed_attribute_ends_the_reading() -> None:
    whole = _nla(3, b"eth0\0")
    assert list(batch.attributes(whole + _nla(4, b"\1\0\0\0")[:6], 0)) == [3]  # longer than what is left
    assert list(batch.attributes(whole + struct.pack("=HH", 2, 4) + b"\0" * 8, 0)) == [3]  # shorter than its header
    assert batch.attributes(whole, 0, end=4) == {}  # nothing past ``end``


def test_only_the_wanted_types_are_read() -> None:
    data = _nla(3, b"eth0\0") + _nla(4, b"\1\0\0\0") + _nla(4, b"\2\0\0\0") + _nla(5, b"\3\0\0\0")
    found = batch.attributes(data, 0, (4, 9))
    assert list(found) == [4] and struct.unpack("=I", found[4])[0] == 1  # still the first of its type
