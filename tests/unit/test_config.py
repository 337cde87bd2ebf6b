"""Config loading as libcni's conf.go: formats, order, drop-ins, versions, and errors naming files."""

from __future__ import annotations

import json

import pytest

from pycni import config
from pycni.errors import ConfigError, NetworkNotFoundError, NoConfigsFoundError


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def conflist(name="net", version="1.0.0", plugins=None, **extra):
    return {"cniVersion": version, "name": name, "plugins": plugins or [{"type": "bridge"}], **extra}


class TestConflistParsing:
    def test_minimal_list(self):
        net = config.conflist_from_bytes(json.dumps(conflist()))
        assert (net.name, net.cni_version, [p.type for p in net.plugins]) == ("net", "1.0.0", ["bridge"])

    def test_unknown_keys_and_big_integers_are_preserved_exactly(self):
        raw = (
            b'{"cniVersion":"1.0.0","name":"n",'
            b'"plugins":[{"type":"x","big":18446744073709551617,"f":1.5,"o":{"k":[1]}}]}'
        )
        plugin = config.conflist_from_bytes(raw).plugins[0]
        assert plugin.raw["big"] == 18446744073709551617 and isinstance(plugin.raw["big"], int)
        assert plugin.raw["f"] == 1.5 and plugin.raw["o"] == {"k": [1]}

    def test_original_bytes_are_kept_for_the_cache(self):
        raw = json.dumps(conflist(), indent=3).encode()
        assert config.conflist_from_bytes(raw).bytes == raw

    @pytest.mark.parametrize(
        "doc, message",
        [
            ("{", "error parsing configuration list: "),
            ('{"cniVersion":"1.0.0","plugins":[{"type":"x"}]}', "error parsing configuration list: no name"),
            ('{"name":3,"plugins":[{"type":"x"}]}', "invalid name type int"),
            ('{"name":"n","cniVersion":1,"plugins":[{"type":"x"}]}', "invalid cniVersion type"),
            ('{"name":"n","plugins":{}}', "invalid 'plugins' type dict"),
            ('{"name":"n","plugins":[]}', "no plugins in list"),
            (
                '{"name":"n","plugins":[{"a":1}]}',
                "failed to parse plugin config 0: error parsing configuration: missing 'type'",
            ),
            ('{"name":"n","plugins":[5]}', "failed to parse plugin config 0"),
            ('{"name":"n"}', "no plugin configs found"),
            ('{"name":"n","loadOnlyInlinedPlugins":true}', "`loadOnlyInlinedPlugins` is true, and no 'plugins' key"),
            ('{"name":"n","plugins":[{"type":"x"}],"disableCheck":"yes"}', "invalid value 'yes' for disableCheck"),
            ('{"name":"n","plugins":[{"type":"x"}],"disableGC":1}', "invalid type for disableGC"),
            ('{"name":"n","plugins":[{"type":"x"}],"cniVersions":"1.0.0"}', "invalid cniVersions type"),
            ('{"name":"n","plugins":[{"type":"x"}],"cniVersions":["1.0.f"]}', "invalid cniVersions entry"),
            ("[1]", "expected a JSON object"),
            ('{"name":"n","plugins":[{"type":"x","n":NaN}]}', "invalid number literal NaN"),
            ('{"name":"n","plugins":[{"type":"x","n":1e999}]}', "out of range"),
        ],
    )
    def test_malformed_lists_name_the_file_and_the_problem(self, tmp_path, doc, message):
        path = write(tmp_path / "bad.conflist", doc)
        with pytest.raises(ConfigError) as e:
            config.conflist_from_file(str(path))
        assert message in str(e.value)
        assert str(e.value).startswith(str(path))

    def test_non_utf8_file(self, tmp_path):
        path = tmp_path / "bad.conflist"
        path.write_bytes(b'{"name":"\xff"}')
        with pytest.raises(ConfigError, match="invalid UTF-8"):
            config.conflist_from_file(str(path))

    def test_deep_nesting_is_an_error_not_a_crash(self):
        with pytest.raises(ConfigError, match="nested too deeply"):
            config.conflist_from_bytes("[" * 100000 + "]" * 100000)

    @pytest.mark.parametrize("value, expected", [(True, True), ("TRUE", True), ("false", False), (False, False)])
    def test_flags_accept_bool_or_true_false_strings(self, value, expected):
        for key, attr in (("disableCheck", "disable_check"), ("disableGC", "disable_gc")):
            net = config.conflist_from_bytes(json.dumps(conflist(**{key: value})))
            assert getattr(net, attr) is expected


class TestVersionSelection:
    @pytest.mark.parametrize(
        "version, versions, expected",
        [
            ("", ["1.1.0", "0.4.0", "1.0.0"], "1.1.0"),
            ("", ["99.0.0", "1.1.0", "0.4.0"], "1.1.0"),
            ("1.2.3", None, "1.2.3"),
            ("1.0.0", ["0.1.0", "0.4.0"], "1.0.0"),
            ("", [], ""),
            ("garbage", None, "garbage"),
            ("2.0.0", ["0.4.0"], "0.4.0"),
        ],
    )
    def test_highest_supported_of_cniversion_and_cniversions(self, version, versions, expected):
        doc = {"name": "n", "plugins": [{"type": "x"}], "cniVersion": version}
        if versions is not None:
            doc["cniVersions"] = versions
        assert config.conflist_from_bytes(json.dumps(doc)).cni_version == expected


class TestSingleConf:
    def test_single_conf_keeps_the_file_bytes_exactly(self, tmp_path):
        raw = b'{ "name" : "n",\n  "type": "bridge", "big": 1.50, "z": 1, "a": 2 }\n'
        path = tmp_path / "n.conf"
        path.write_bytes(raw)
        assert config.conf_from_file(str(path)).bytes == raw
        assert config.load_conf(str(tmp_path), "n").bytes == raw

    def test_a_file_named_exactly_dot_conf_is_loaded_as_go_filepath_ext_says(self, tmp_path):
        write(tmp_path / ".conf", {"name": "hidden", "type": "bridge"})
        assert config.load_conflist(str(tmp_path), "hidden").name == "hidden"

    def test_single_conf_fields_match_keys_case_insensitively_as_go_structs_do(self, tmp_path):
        write(tmp_path / "a.conf", {"Name": "mynet", "Type": "bridge", "CNIVERSION": "0.4.0"})
        net = config.load_conflist(str(tmp_path), "mynet")
        assert (net.name, net.cni_version, net.plugins[0].type) == ("mynet", "0.4.0", "bridge")

    def test_exact_key_and_folded_key_later_one_wins_like_go(self):
        assert config.conf_from_bytes(b'{"type": "a", "TYPE": "b"}').type == "b"
        assert config.conf_from_bytes(b'{"TYPE": "b", "type": "a"}').type == "a"

    def test_capabilities_are_a_go_map_matched_exactly(self):
        conf = config.conf_from_bytes(b'{"type": "a", "Capabilities": {"portMappings": true, "PortMappings": true}}')
        assert conf.capabilities == ("portMappings", "PortMappings")

    @pytest.mark.parametrize(
        ("doc", "message"),
        [
            ({"name": 5, "type": "a"}, "cannot unmarshal number into Go struct field PluginConf.name of type string"),
            ({"capabilities": {"portMappings": "yes"}, "type": "a"}, "PluginConf.capabilities of type bool"),
            ({"ipam": "host-local", "type": "a"}, "unmarshal string into Go struct field PluginConf.ipam"),
            ({"ipam": {"TYPE": 1}, "type": "a"}, "PluginConf.ipam.type of type string"),
            ({"dns": {"nameservers": "x"}, "type": "a"}, "PluginConf.dns.nameservers of type []string"),
            ({"prevResult": [], "type": "a"}, "PluginConf.prevResult"),
        ],
    )
    def test_wrongly_typed_field_ahead_of_the_target_aborts_the_search_like_libcni(self, tmp_path, doc, message):
        write(tmp_path / "00.conf", doc)
        write(tmp_path / "10.conf", {"name": "good", "type": "bridge"})
        with pytest.raises(ConfigError, match="error parsing configuration: json: ") as e:
            config.load_conflist(str(tmp_path), "good")
        assert message in str(e.value) and "00.conf" in str(e.value)

    def test_upconverted_to_a_one_plugin_list(self):
        conf = config.conf_from_bytes(b'{"cniVersion":"0.4.0","name":"single","type":"bridge","bridge":"br9"}')
        net = config.conflist_from_conf(conf)
        assert (net.name, net.cni_version) == ("single", "0.4.0")
        assert net.plugins[0].raw["bridge"] == "br9"

    def test_missing_type(self, tmp_path):
        path = write(tmp_path / "x.conf", {"name": "n"})
        with pytest.raises(ConfigError, match="missing 'type'"):
            config.conf_from_file(str(path))


class TestLoadConflist:
    def test_conflists_first_in_lexical_order_then_single_confs(self, tmp_path):
        write(tmp_path / "20-b.conflist", conflist("net", plugins=[{"type": "second"}]))
        write(tmp_path / "10-a.conflist", conflist("net", plugins=[{"type": "first"}]))
        write(tmp_path / "00.conf", {"name": "net", "type": "single"})
        write(tmp_path / "05.json", {"name": "other", "type": "json-single"})
        assert config.load_conflist(str(tmp_path), "net").plugins[0].type == "first"
        assert config.load_conflist(str(tmp_path), "other").plugins[0].type == "json-single"

    def test_a_broken_file_aborts_even_for_another_network(self, tmp_path):
        write(tmp_path / "10.conflist", conflist("good"))
        write(tmp_path / "05.conflist", "{")
        with pytest.raises(ConfigError, match="05.conflist"):
            config.load_conflist(str(tmp_path), "good")

    def test_no_configs_vs_not_found(self, tmp_path):
        with pytest.raises(NoConfigsFoundError, match="no net configurations found in"):
            config.load_conflist(str(tmp_path / "missing"), "x")
        write(tmp_path / "a.conflist", conflist("a"))
        with pytest.raises(NetworkNotFoundError, match='no net configuration with name "x"'):
            config.load_conflist(str(tmp_path), "x")

    def test_drop_in_plugins_are_appended_unless_inlined_only(self, tmp_path):
        write(tmp_path / "n.conflist", conflist("n", plugins=[{"type": "a"}]))
        write(tmp_path / "n" / "20-c.conf", {"type": "c"})
        write(tmp_path / "n" / "10-b.conf", {"type": "b"})
        write(tmp_path / "n" / "ignored.json", {"type": "z"})
        net = config.load_conflist(str(tmp_path), "n")
        assert [p.type for p in net.plugins] == ["a", "b", "c"]
        assert b'"b"' not in net.bytes
        write(tmp_path / "n.conflist", conflist("n", plugins=[{"type": "a"}], loadOnlyInlinedPlugins=True))
        assert [p.type for p in config.load_conflist(str(tmp_path), "n").plugins] == ["a"]

    def test_drop_ins_alone_make_a_network(self, tmp_path):
        write(tmp_path / "n.conflist", {"cniVersion": "1.0.0", "name": "n"})
        write(tmp_path / "n" / "a.conf", {"type": "a"})
        assert [p.type for p in config.load_conflist(str(tmp_path), "n").plugins] == ["a"]

    @pytest.mark.parametrize("name", ["../etc", "a/b", ".."])
    def test_a_name_that_is_not_one_path_component_gets_no_drop_ins(self, tmp_path, name):
        write(tmp_path / "etc" / "evil.conf", {"type": "evil"})
        write(tmp_path / "a" / "b" / "evil.conf", {"type": "evil"})
        write(tmp_path / "sub" / "x.conflist", conflist(name))
        net = config.conflist_from_file(str(tmp_path / "sub" / "x.conflist"))
        assert [p.type for p in net.plugins] == ["bridge"]

    # libcni loads what it does not validate; names and types are checked where they are used.
    def test_unrelated_conflist_with_an_invalid_name_does_not_abort_the_search(self, tmp_path):
        write(tmp_path / "00.conflist", conflist("my net!"))
        write(tmp_path / "10.conflist", conflist("good"))
        assert config.load_conflist(str(tmp_path), "good").name == "good"
        assert config.load_conflist(str(tmp_path), "my net!").name == "my net!"

    def test_conf_with_a_path_in_its_type_ahead_of_the_target_does_not_abort_the_search(self, tmp_path):
        write(tmp_path / "00.conf", {"name": "other", "type": "../../bin/sh"})
        write(tmp_path / "10.conf", {"name": "good", "type": "bridge"})
        assert config.load_conflist(str(tmp_path), "good").plugins[0].type == "bridge"
        assert config.load_conflist(str(tmp_path), "other").plugins[0].type == "../../bin/sh"

    def test_conf_files_skips_directories_and_other_extensions(self, tmp_path):
        write(tmp_path / "b.conf", {})
        write(tmp_path / "a.conflist", {})
        (tmp_path / "d.conf").mkdir()
        write(tmp_path / "c.txt", {})
        names = [p.rsplit("/", 1)[1] for p in config.conf_files(str(tmp_path), (".conf", ".conflist"))]
        assert names == ["a.conflist", "b.conf"]

    def test_list_networks_first_file_of_a_name_wins(self, tmp_path):
        write(tmp_path / "1.conflist", conflist("a", plugins=[{"type": "first"}]))
        write(tmp_path / "2.conflist", conflist("a", plugins=[{"type": "second"}]))
        write(tmp_path / "3.conf", {"name": "b", "type": "s"})
        nets = config.list_networks(str(tmp_path))
        assert [(n.name, n.plugins[0].type) for n in nets] == [("a", "first"), ("b", "s")]
