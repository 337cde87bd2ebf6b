"""The element comment format has one writer and one reader: what one writes the other reads back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pycni.sdk import Attachment
from pycni_plugins.kernel.nft import Comment, comment

# Anything an attachment may be called, spaces and quotes included: the writer makes it nft-safe.
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40)


def test_the_comment_names_key_owner_and_attachment() -> None:
    att = Attachment("net1", "c 1", "eth0")
    text = comment(att, "portmap")
    assert text == f"{att.key} portmap net1 c_1 eth0"
    parsed = Comment.parse(text)
    assert parsed == Comment(att.key, "portmap", "net1", "c_1", "eth0")
    assert parsed.names(att) and not parsed.names(Attachment("net1", "c 1", "eth1"))
    assert parsed.label == "net1 c_1 eth0"


@given(network=names, container_id=names, ifname=names, owner=st.sampled_from(["masq", "portmap", "firewall"]))
def test_what_is_written_is_read_back(network: str, container_id: str, ifname: str, owner: str) -> None:
    att = Attachment(network, container_id, ifname)
    written = Comment.of(att, owner)
    text = str(written)
    assert len(text) <= 127 and '"' not in text
    parsed = Comment.parse(text)
    assert parsed.key == att.key and parsed.owner == owner and parsed.names(att)
    if len(f"{written.key} {owner} {written.label}") <= 127:
        assert parsed == written  # nothing was cut
    assert str(parsed) == text


@given(st.text(alphabet=st.sampled_from("ab _"), max_size=200))
def test_any_text_parses_and_prints_back(text: str) -> None:
    parsed = Comment.parse(text)
    assert str(parsed) == text[:127]
    assert parsed.key == text.split(" ")[0]
    assert (parsed.owner is None) == (" " not in text)


def test_a_cut_comment_keeps_its_key() -> None:
    att = Attachment("n" * 60, "c" * 60, "eth0")
    parsed = Comment.parse(comment(att, "masq"))
    assert parsed.key == att.key and parsed.owner == "masq" and parsed.ifname is None
    assert parsed.names(att)


def test_an_uncommented_element_or_a_bare_key_names_no_attachment() -> None:
    att = Attachment("n", "c", "eth0")
    assert Comment.parse("") == Comment("")
    assert not Comment.parse("").names(att)
    assert not Comment.parse(att.key).names(att)  # a key without an owner is no attachment's comment
    assert Comment.parse("").label == ""
