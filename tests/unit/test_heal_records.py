"""What a heal needs from a record, without the plugins' configs: each section a record names
comes back from its (family, sentinel) pair; CHECK's details end with the fix."""

from __future__ import annotations

import ipaddress

import pytest

from pycni_plugins.kernel import layout, nft

V4 = ipaddress.ip_network("198.18.0.0/24")
V6 = ipaddress.ip_network("fd00:18::/64")
SECTIONS = [
    layout.MASQ,
    layout.masq_subnet(V4),
    layout.masq_subnet(V6),
    layout.PORTMAP,
    layout.hairpin_subnet(V4),
    layout.hairpin_subnet(V6),
    layout.HAIRPIN_ALL,
    layout.FIREWALL,
    layout.admin_section("CNI-ADMIN"),
    layout.admin_section("NOMAD-ADMIN"),
    layout.ISOLATION,
    layout.SPOOFCHK,
]


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: f"{s.family}-{s.sentinel}")
def test_a_section_comes_back_from_its_name(section):
    assert layout.section_named(section.family, section.sentinel) == section


@pytest.mark.parametrize("name", [("bridge", "forward"), ("inet", "epoch"), ("inet", "bad name"), ("ip", "forward")])
def test_names_of_no_section(name):
    assert layout.section_named(*name) is None


def test_records_without_section_names_fall_back_to_the_owner():
    masq = layout.masq_element(ipaddress.ip_interface("198.18.0.2/24"))
    assert layout.record_sections("masq", [masq], []) == [layout.MASQ, layout.masq_subnet(V4)]
    named = [("inet", "forward"), ("inet", "NOMAD-ADMIN")]
    assert layout.record_sections("firewall", [], named) == [layout.FIREWALL, layout.admin_section("NOMAD-ADMIN")]


def test_check_details_end_with_the_fix():
    assert nft.hinted("net1") == "run `pycni gc net1 --reconcile` to restore"
    assert nft.hinted("net1", "a", "", "b") == "a; b; run `pycni gc net1 --reconcile` to restore"
    taken = "element 198.18.0.2 of set firewall4 of table inet pycni belongs to another attachment (n c eth0)"
    assert nft.hinted("net1", taken) == taken
    assert nft.hinted("net1", about=taken) == ""
