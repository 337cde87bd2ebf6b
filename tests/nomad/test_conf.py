"""Finding a network config by name in the CNI config dir (Nomad's loadCNIConf and cniConfParser)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pycni import client
from pycni.nomad.conf import ConfSource, load_cni_conf, network_mode
from pycni.nomad.errors import ConfLoadError
from pycni.nomad.models import Allocation

from .conftest import group, mock_connect_alloc

CASES = [
    (
        "good-conflist",
        "good.conflist",
        '{"cniVersion":"1.0.0","name":"good-conflist","plugins":[{"type":"cool-plugin"}]}',
    ),
    ("good-conf", "good.conf", '{"cniVersion":"1.0.0","name":"good-conf","type":"cool-plugin"}'),
    ("good-json", "good.json", '{"cniVersion":"1.0.0","name":"good-json","type":"cool-plugin"}'),
]
BAD = [
    ("no-config", None, None, "no CNI network config found in"),
    ("invalid-conflist", "invalid.conflist", "{invalid}", "error parsing configuration list:"),
    ("invalid-conf", "invalid.conf", "{invalid}", "error parsing configuration:"),
    ("invalid-json", "invalid.json", "{invalid}", "error parsing configuration:"),
]


@pytest.mark.parametrize(("name", "filename", "content"), CASES, ids=[c[0] for c in CASES])
def test_conf_parser_finds_the_named_network(tmp_path: Path, name: str, filename: str, content: str) -> None:
    # Nomad's TestLoadCNIConf_confParser: the option loads one network of one "cool-plugin".
    (tmp_path / filename).write_text(content)
    source = load_cni_conf(str(tmp_path), name)
    assert source.name == name
    cni = client.CNI(plugin_dirs=[str(tmp_path)], conf_dir=str(tmp_path), cache_dir=str(tmp_path / "cache"))
    cni.load(source.option(client))
    networks = cni.get_config().networks
    assert len(networks) == 1
    assert [p.type for p in networks[0].config.plugins] == ["cool-plugin"]
    assert networks[0].ifname == "eth0"


@pytest.mark.parametrize(("name", "filename", "content", "error"), BAD, ids=[c[0] for c in BAD])
def test_conf_parser_errors(tmp_path: Path, name: str, filename: str | None, content: str | None, error: str) -> None:
    if filename is not None and content is not None:
        (tmp_path / filename).write_text(content)
    with pytest.raises(ConfLoadError) as info:
        load_cni_conf(str(tmp_path), name)
    assert error in str(info.value)
    assert str(info.value).startswith("failed to load CNI config: ")


def test_a_parse_error_before_the_match_aborts_the_search(tmp_path: Path) -> None:
    (tmp_path / "10-broken.conf").write_text("{")
    (tmp_path / "20-mine.conflist").write_text('{"name":"mine","cniVersion":"1.0.0","plugins":[{"type":"x"}]}')
    with pytest.raises(ConfLoadError, match="10-broken.conf"):
        load_cni_conf(str(tmp_path), "mine")


def test_a_wrongly_typed_conf_field_before_the_match_aborts_the_search_like_libcni(tmp_path: Path) -> None:
    (tmp_path / "10-other.conf").write_text('{"name": 5, "type": "x"}')
    (tmp_path / "20-mine.conflist").write_text('{"name":"mine","cniVersion":"1.0.0","plugins":[{"type":"x"}]}')
    with pytest.raises(ConfLoadError) as e:
        load_cni_conf(str(tmp_path), "mine")
    expected = f"failed to load CNI config file {tmp_path}/10-other.conf: error parsing configuration: json:"
    assert expected in str(e.value)


def test_a_single_conf_is_handed_on_with_its_exact_bytes(tmp_path: Path) -> None:
    raw = b'{"type": "x",  "name": "mine", "n": 1.0}\n'
    (tmp_path / "10-mine.conf").write_bytes(raw)
    assert load_cni_conf(str(tmp_path), "mine").conf_bytes == raw


def test_files_after_the_first_match_are_not_read(tmp_path: Path) -> None:
    (tmp_path / "10-mine.conf").write_text('{"name":"mine","cniVersion":"1.0.0","type":"x"}')
    (tmp_path / "20-broken.conflist").write_text("{")
    assert load_cni_conf(str(tmp_path), "mine").conf_bytes


def test_lexical_order_and_case_sensitive_names(tmp_path: Path) -> None:
    (tmp_path / "b.conflist").write_text('{"name":"net","cniVersion":"1.0.0","plugins":[{"type":"second"}]}')
    (tmp_path / "a.json").write_text('{"name":"net","cniVersion":"1.0.0","type":"first"}')
    (tmp_path / "c.conf").write_text('{"name":"Net","cniVersion":"1.0.0","type":"other"}')
    assert b"first" in load_cni_conf(str(tmp_path), "net").conf_bytes
    with pytest.raises(ConfLoadError, match='^failed to load CNI config: CNI network config not found for name "NET"$'):
        load_cni_conf(str(tmp_path), "NET")


def test_missing_dir_counts_as_empty(tmp_path: Path) -> None:
    with pytest.raises(ConfLoadError, match="no CNI network config found in"):
        load_cni_conf(str(tmp_path / "absent"), "x")


class _Api:
    def with_conf_list_bytes(self, data: bytes) -> tuple[str, bytes]:
        return ("list", data)

    def with_conf(self, data: bytes) -> tuple[str, bytes]:
        return ("conf", data)


def test_option_prefers_the_conflist() -> None:
    assert ConfSource("n", list_bytes=b"L", conf_bytes=b"C").option(_Api()) == ("list", b"L")
    assert ConfSource("n", conf_bytes=b"C").option(_Api()) == ("conf", b"C")
    with pytest.raises(ConfLoadError, match="^no CNI network config found$"):
        ConfSource("n").option(_Api())


def test_from_conflist_reads_the_name() -> None:
    assert ConfSource.from_conflist(b'{"name":"nomad","plugins":[]}').name == "nomad"
    with pytest.raises(ConfLoadError):
        ConfSource.from_conflist(b"[]")


@pytest.mark.parametrize(
    ("networks", "expected"),
    [
        (None, ("host", "")),
        ([], ("host", "")),
        ([{"Mode": "host"}], ("host", "")),
        ([{"Mode": ""}], ("host", "")),
        ([{"Mode": "none"}], ("host", "")),
        ([{"Mode": "bridge"}], ("bridge", "")),
        ([{"Mode": "Bridge"}], ("bridge", "")),
        ([{"Mode": "cni/MyNet"}], ("cni", "mynet")),
        ([{"Mode": "host"}, {"Mode": "bridge"}], ("host", "")),  # only the first network counts
    ],
)
def test_network_mode_selection(networks: list[dict[str, str]] | None, expected: tuple[str, str]) -> None:
    doc = mock_connect_alloc()
    group(doc)["Networks"] = networks
    assert network_mode(Allocation.from_json(doc)) == expected
