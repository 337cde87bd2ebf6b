"""host-local's allocator against the in-memory store: the reference's order, errors and
all-or-nothing rule, with no disk involved (``backend/allocator`` tests over the fake store).

The on-disk store is exercised by ``test_host_local.py``; the last test here checks that the fake
and the disk store hand out the same leases, so these tests say what the plugin does.
"""

from __future__ import annotations

from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest

from pycni.errors import CNIError, ErrorCode
from pycni.sdk import PluginRequest
from pycni_plugins.host_local.allocator import allocate
from pycni_plugins.host_local.config import HostLocalConfig, load_config
from pycni_plugins.host_local.disk import DiskStore
from pycni_plugins.host_local.fake_store import FakeStore

OWNER = b"c1\r\neth0"


def conf(ranges: list[list[dict[str, Any]]], *, ips: list[str] | None = None) -> HostLocalConfig:
    config: dict[str, Any] = {"cniVersion": "1.0.0", "name": "net", "type": "bridge"}
    config["ipam"] = {"type": "host-local", "ranges": ranges}
    if ips is not None:
        config["runtimeConfig"] = {"ips": ips}
    return load_config(PluginRequest("ADD", config, container_id="c1", ifname="eth0"))


def addresses(store: FakeStore, config: HostLocalConfig, cid: str = "c1") -> list[str]:
    with store.locked():
        return [str(ip) for ip, _ in allocate(store, config, cid, "eth0")]


def refusal(store: FakeStore, config: HostLocalConfig) -> str:
    with pytest.raises(CNIError) as info, store.locked():
        allocate(store, config, "c1", "eth0")
    assert info.value.code == ErrorCode.INTERNAL
    return info.value.msg


NET = [[{"subnet": "198.18.0.0/29"}]]  # .1 gateway, .2-.6 handed out


def test_first_allocation_skips_the_gateway_and_records_the_last_reserved_ip():
    store = FakeStore()
    assert addresses(store, conf(NET)) == ["198.18.0.2"]
    assert store.leases == {"198.18.0.2": OWNER}
    assert store.last == {0: "198.18.0.2"}


def test_next_allocation_follows_the_last_reserved_ip_and_skips_taken_ones():
    store = FakeStore({"198.18.0.4": b"other\r\neth0"}, {0: "198.18.0.3"})
    assert addresses(store, conf(NET)) == ["198.18.0.5"]


def test_allocation_wraps_around_to_the_range_start_past_the_gateway():
    store = FakeStore(last={0: "198.18.0.6"})
    assert addresses(store, conf(NET)) == ["198.18.0.2"]


def test_a_full_range_hands_over_to_the_next_range_of_its_set():
    ranges = [[{"subnet": "198.18.0.0/30"}, {"subnet": "198.18.1.0/30"}]]  # one address each: .2
    store = FakeStore({"198.18.0.2": b"other\r\neth0"})
    assert addresses(store, conf(ranges)) == ["198.18.1.2"]


def test_one_address_per_range_set_in_set_order():
    ranges = [[{"subnet": "198.18.0.0/24"}], [{"subnet": "2001:db8::/64"}]]
    assert addresses(FakeStore(), conf(ranges)) == ["198.18.0.2", "2001:db8::2"]


def test_an_exhausted_set_fails_and_releases_what_the_call_reserved():
    ranges = [[{"subnet": "198.18.0.0/24"}], [{"subnet": "198.18.1.0/30"}]]
    store = FakeStore({"198.18.1.2": b"other\r\neth0"})
    msg = refusal(store, conf(ranges))
    assert msg == "failed to allocate for range 1: no IP addresses available in range set: 198.18.1.1-198.18.1.2"
    assert store.leases == {"198.18.1.2": b"other\r\neth0"}  # set 0's reservation rolled back


def test_rollback_keeps_the_attachments_earlier_leases():
    # Go releases by ID on failure, which would also free what an earlier ADD leased.
    ranges = [[{"subnet": "198.18.0.0/24"}]]
    store = FakeStore({"198.18.0.9": OWNER})
    assert "duplicate allocation is not allowed" in refusal(store, conf(ranges))
    assert store.leases == {"198.18.0.9": OWNER}


def test_a_requested_ip_is_taken_from_the_set_that_contains_it():
    store = FakeStore()
    assert addresses(store, conf(NET, ips=["198.18.0.5"])) == ["198.18.0.5"]
    assert store.last == {0: "198.18.0.5"}


@pytest.mark.parametrize(
    ("leases", "ip", "expected"),
    [
        pytest.param({}, "198.18.0.1", "failed to allocate for range 0: requested ip 198.18.0.1 is subnet's gateway"),
        pytest.param(
            {"198.18.0.5": b"other\r\neth0"},
            "198.18.0.5",
            "failed to allocate for range 0: requested IP address 198.18.0.5 is not available in range set "
            "198.18.0.1-198.18.0.6",
        ),
    ],
    ids=["gateway", "taken"],
)
def test_a_requested_ip_that_cannot_be_had_is_refused(leases: dict[str, bytes], ip: str, expected: str):
    store = FakeStore(leases)
    assert refusal(store, conf(NET, ips=[ip])) == expected
    assert store.leases == leases


def test_a_requested_ip_outside_every_set_fails_after_all_and_leaves_nothing():
    store = FakeStore()
    assert refusal(store, conf(NET, ips=["198.18.9.9"])) == "failed to allocate all requested IPs: 198.18.9.9"
    assert store.leases == {}


@pytest.mark.parametrize("content", [OWNER, b"c1"], ids=["lease", "legacy-bare-id-lease"])
def test_a_second_address_for_the_attachment_in_one_set_is_refused(content: bytes):
    store = FakeStore({"198.18.0.3": content})
    msg = refusal(store, conf(NET))
    assert (
        msg
        == "failed to allocate for range 0: 198.18.0.3 has been allocated to c1, duplicate allocation is not allowed"
    )


def test_the_lease_cache_hint_only_reorders_and_never_refuses():
    # Hinted addresses are tried last; a stale hint (nothing is leased) still yields an address.
    assert addresses(FakeStore(hints={"198.18.0.2"}), conf(NET)) == ["198.18.0.3"]
    everything = {f"198.18.0.{i}" for i in range(2, 7)}
    assert addresses(FakeStore(hints=everything), conf(NET)) == ["198.18.0.2"]


def test_a_full_set_reports_no_addresses():
    store = FakeStore({f"198.18.0.{i}": b"other\r\neth0" for i in range(2, 7)})
    assert (
        refusal(store, conf(NET))
        == "failed to allocate for range 0: no IP addresses available in range set: 198.18.0.1-198.18.0.6"
    )


def test_release_and_gc_follow_the_disk_rules():
    store = FakeStore({"198.18.0.2": OWNER, "198.18.0.3": b"c1", "198.18.0.4": b"c2\r\neth0"})
    store.release("c1", "eth0", passes=1)  # one ReleaseByID: the attachment's lease only
    assert set(store.leases) == {"198.18.0.3", "198.18.0.4"}
    store.release("c1", "eth0", passes=1)  # none left: then the legacy ones
    assert set(store.leases) == {"198.18.0.4"}
    assert store.collect(set(), dry_run=True) == [("198.18.0.4", "c2/eth0")]
    assert store.collect({("c2", "eth0")}, dry_run=False) == []
    assert store.collect(set(), dry_run=False) == [("198.18.0.4", "c2/eth0")]
    assert store.leases == {}


def test_the_fake_store_allocates_as_the_disk_store_does(tmp_path: Path):
    ranges = [[{"subnet": "198.18.0.0/28"}], [{"subnet": "2001:db8::/120"}]]
    fake = FakeStore()
    with DiskStore(str(tmp_path), "net") as disk:
        for i in range(5):
            config = conf(ranges, ips=["198.18.0.9"] if i == 2 else None)
            with disk.locked():
                on_disk = [ip for ip, _ in allocate(disk, config, f"c{i}", "eth0")]
            with fake.locked():
                in_memory = [ip for ip, _ in allocate(fake, config, f"c{i}", "eth0")]
            assert on_disk == in_memory
            assert disk.last_reserved(0) == fake.last_reserved(0)
        files = {p.name: p.read_bytes() for p in (tmp_path / "net").iterdir() if p.name[0].isdigit()}
    assert files == fake.leases
    assert fake.last_reserved(0) == ip_address("198.18.0.11")


def test_a_config_decoded_again_is_the_same_immutable_object_until_it_or_cni_args_change():
    from pycni_plugins.host_local import config as config_module

    base = {
        "cniVersion": "1.0.0",
        "name": "memo",
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "198.18.3.0/24"}]]},
    }
    first = load_config(PluginRequest("ADD", base))
    assert load_config(PluginRequest("DEL", dict(base), container_id="other")) is first
    asking = load_config(PluginRequest("ADD", base, args="IP=198.18.3.9"))
    assert asking.requested_ips == (ip_address("198.18.3.9"),) and first.requested_ips == ()
    moved = {**base, "ipam": {**base["ipam"], "ranges": [[{"subnet": "198.18.4.0/24"}]]}}
    assert str(load_config(PluginRequest("ADD", moved)).range_sets[0][0].subnet) == "198.18.4.0/24"
    with pytest.raises(AttributeError):
        first.range_sets = ()  # type: ignore[misc]
    bad = {**base, "ipam": {"type": "host-local", "ranges": [[{"subnet": "198.18.3.0/33"}]]}}
    for _ in range(2):  # a refused config is refused every time, never remembered
        with pytest.raises(CNIError, match="invalid CIDR address"):
            load_config(PluginRequest("ADD", bad))
    with_prev = {**base, "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "198.18.3.7/24"}]}}
    assert load_config(PluginRequest("DEL", with_prev)) is first  # what load_config never reads is not the key
    for i in range(2 * config_module._DECODED_MAX):
        load_config(PluginRequest("ADD", {**base, "name": f"memo{i}"}))
    assert len(config_module._decoded) <= config_module._DECODED_MAX


def test_a_config_whose_decoding_its_text_does_not_tell_is_decoded_every_time():
    from pycni._json import loads

    base = {"cniVersion": "1.0.0", "name": "plain", "ipam": {"type": "host-local", "dataDir": "/a"}}
    ipam = '{"type":"host-local","dataDir":"/a"}'
    ranges = '{"ranges":[[{"subnet":"198.18.5.0/24"}]]}'
    text = f'{{"cniVersion":"1.0.0","name":"plain","ipam":{ipam},"IPAM":{ranges},"ipam":{ipam}}}'
    repeated = loads(text)  # "ipam" twice: Go decodes the members in turn, and the last one wins
    same_text = dict(repeated)  # the same JSON text, where the "IPAM" after "ipam" wins
    assert same_text == {**base, "IPAM": {"ranges": [[{"subnet": "198.18.5.0/24"}]]}}
    assert str(load_config(PluginRequest("ADD", same_text)).range_sets[0][0].subnet) == "198.18.5.0/24"
    for _ in range(2):
        with pytest.raises(CNIError, match="no IP ranges specified"):
            load_config(PluginRequest("ADD", repeated))
    listed = {**base, "ipam": {"type": "host-local", "ranges": [[{"subnet": "198.18.6.0/24"}]]}}
    assert str(load_config(PluginRequest("ADD", listed)).range_sets[0][0].subnet) == "198.18.6.0/24"
    as_tuple = {**base, "ipam": {"type": "host-local", "ranges": ([{"subnet": "198.18.6.0/24"}],)}}
    with pytest.raises(CNIError, match="cannot unmarshal"):  # encodes as the list above, decodes otherwise
        load_config(PluginRequest("ADD", as_tuple))
