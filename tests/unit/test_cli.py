"""The cnitool-compatible CLI: env handling, container ID derivation, output, errors and exit codes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from pycni.cli import cli
from pycni.cli.runtime_commands import container_id_for


@pytest.fixture
def env(fake_plugins, tmp_path):
    confdir = tmp_path / "net.d"
    confdir.mkdir()
    (confdir / "10-test.conflist").write_bytes(
        fake_plugins.conflist(
            fake_plugins.plugin("fake-a") | {"capabilities": {"portMappings": True}}, fake_plugins.plugin("fake-b")
        )
    )
    return {
        "NETCONFPATH": str(confdir),
        "CNI_PATH": str(fake_plugins.dir),
        "PYCNI_CACHE_DIR": str(tmp_path / "cache"),
        "PYCNI_BACKEND": "exec",
    }


def run(args, env, **kw):
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False, **kw)


def test_container_id_is_derived_like_cnitool():
    digest = hashlib.sha512(b"/run/netns/x").hexdigest()
    assert container_id_for("/run/netns/x") == "cnitool-" + digest[:20]


def test_add_prints_the_result_indented_without_trailing_newline(env, fake_plugins):
    out = run(["add", "testnet", "/run/netns/x"], env)
    assert out.exit_code == 0, out.output
    assert not out.output.endswith("\n") and out.output.startswith("{\n    ")
    assert json.loads(out.output)["ips"][0]["address"] == "198.18.0.2/24"
    call = fake_plugins.calls()[0]["env"]
    assert call["CNI_CONTAINERID"] == container_id_for("/run/netns/x")
    assert call["CNI_IFNAME"] == "eth0" and call["CNI_NETNS"] == "/run/netns/x"


def test_environment_is_honoured_and_options_override_it(env, fake_plugins):
    env = env | {"CNI_IFNAME": "net1", "CNI_ARGS": "A=1;B=2", "CAP_ARGS": '{"portMappings":[{"hostPort":1}]}'}
    assert run(["add", "testnet", "/run/netns/x"], env).exit_code == 0
    first = fake_plugins.calls()[0]
    assert (first["env"]["CNI_IFNAME"], first["env"]["CNI_ARGS"]) == ("net1", "A=1;B=2")
    assert first["stdin"]["runtimeConfig"] == {"portMappings": [{"hostPort": 1}]}
    out = run(["add", "testnet", "/run/netns/y", "--ifname", "eth7", "--container-id", "mine", "--args", "C=3"], env)
    assert out.exit_code == 0
    last = fake_plugins.calls()[-1]["env"]
    assert (last["CNI_IFNAME"], last["CNI_CONTAINERID"], last["CNI_ARGS"]) == ("eth7", "mine", "C=3")


def test_state_dir_option_overrides_the_environment_for_the_plugins(env, fake_plugins, tmp_path):
    env = env | {"PYCNI_STATE_DIR": str(tmp_path / "from-env")}
    assert run(["add", "testnet", "/run/netns/x"], env).exit_code == 0
    assert run(["del", "testnet", "/run/netns/x", "--state-dir", str(tmp_path / "opt")], env).exit_code == 0
    seen = [c["env"]["PYCNI_STATE_DIR"] for c in fake_plugins.calls()]
    assert seen == [str(tmp_path / "from-env")] * 2 + [str(tmp_path / "opt")] * 2


def test_check_and_del_and_repeated_del(env, fake_plugins):
    assert run(["add", "testnet", "/run/netns/x"], env).exit_code == 0
    assert run(["check", "testnet", "/run/netns/x"], env).exit_code == 0
    assert run(["del", "testnet", "/run/netns/x"], env).exit_code == 0
    assert run(["del", "testnet", "/run/netns/x"], env).exit_code == 0
    commands = [c["env"]["CNI_COMMAND"] for c in fake_plugins.calls()]
    assert commands == ["ADD", "ADD", "CHECK", "CHECK", "DEL", "DEL", "DEL", "DEL"]


def test_gc_with_valid_attachments_deletes_the_others_and_all_stale_deletes_every_cached_one(env, fake_plugins):
    run(["add", "testnet", "/run/netns/x"], env)
    run(["add", "testnet", "/run/netns/y"], env)
    assert run(["gc", "testnet", "--valid", f"{container_id_for('/run/netns/y')}:eth0"], env).exit_code == 0
    dels = [c["env"]["CNI_CONTAINERID"] for c in fake_plugins.calls() if c["env"]["CNI_COMMAND"] == "DEL"]
    assert dels == [container_id_for("/run/netns/x")] * 2
    assert run(["gc", "testnet", "--all-stale"], env).exit_code == 0
    dels = [c["env"]["CNI_CONTAINERID"] for c in fake_plugins.calls() if c["env"]["CNI_COMMAND"] == "DEL"]
    assert dels[-2:] == [container_id_for("/run/netns/y")] * 2


def test_gc_without_valid_or_all_stale_refuses_naming_what_it_would_remove(env, fake_plugins):
    run(["add", "testnet", "/run/netns/x"], env)
    out = CliRunner().invoke(cli, ["gc", "testnet"], env=env)
    assert out.exit_code == 1
    cid = container_id_for("/run/netns/x")
    assert out.output == (
        f"Error: refusing to GC 'testnet' without valid attachments: it would DEL {cid}/eth0 and have every plugin "
        "remove all it keeps for 'testnet'. Name the live ones with --valid CID:IFNAME, pass --all-stale, "
        "or --reconcile (only those whose netns is gone); --dry-run lists\n"
    )
    assert [c["env"]["CNI_COMMAND"] for c in fake_plugins.calls()] == ["ADD", "ADD"]


def test_gc_dry_run_lists_the_stale_attachments_and_changes_nothing(env, fake_plugins):
    run(["add", "testnet", "/run/netns/x"], env)
    run(["add", "testnet", "/run/netns/y"], env)
    keep = f"{container_id_for('/run/netns/y')}:eth0"
    out = run(["gc", "testnet", "--dry-run", "--valid", keep], env)
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {
        "network": "testnet",
        "dryRun": True,
        "staleAttachments": [f"{container_id_for('/run/netns/x')}/eth0 (netns /run/netns/x)"],
    }
    assert len(json.loads(run(["gc", "testnet", "--dry-run"], env).output)["staleAttachments"]) == 2
    assert [c["env"]["CNI_COMMAND"] for c in fake_plugins.calls()] == ["ADD"] * 4


@pytest.mark.parametrize("flags", [["--all-stale", "--reconcile"], ["--all-stale", "--valid", "a:eth0"]])
def test_gc_stale_selectors_are_alternatives(env, flags):
    assert CliRunner().invoke(cli, ["gc", "testnet", *flags], env=env).exit_code == 2


def test_failures_print_one_line_with_the_code_and_exit_1(env):
    cmd = [sys.executable, "-m", "pycni.cli", "add", "nope", "/run/netns/x"]
    proc = subprocess.run(cmd, env=env | {"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("pycni: error (code 7): ") and "no network named 'nope'" in proc.stderr


def test_an_unknown_network_is_one_line_naming_the_dir_once_and_the_close_names(env, tmp_path):
    out = CliRunner().invoke(cli, ["check", "tsetnet", "/run/netns/x"], env=env)
    assert out.exit_code == 1
    assert out.output == (
        f"pycni: error (code 7): no network named 'tsetnet' in {tmp_path / 'net.d'}; did you mean 'testnet'?; "
        "`pycni conf list` lists them all\n"
    )
    missing = CliRunner().invoke(cli, ["del", "x", "/run/netns/x", "--conf-dir", str(tmp_path / "nope")], env=env)
    assert missing.output == (
        f"pycni: error (code 7): no network named 'x' in {tmp_path / 'nope'} (no such directory); "
        "`pycni conf list` lists them all\n"
    )


def test_plugin_error_code_reaches_the_user(env, fake_plugins, tmp_path):
    conf = tmp_path / "net.d" / "20-err.conflist"
    conf.write_bytes(
        fake_plugins.conflist(fake_plugins.plugin("fake-a", STATUS={"error": {"code": 51, "msg": "x"}}), name="errnet")
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pycni.cli", "status", "errnet"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 1 and "(code 51)" in proc.stderr


def test_usage_errors_exit_2(env):
    proc = subprocess.run([sys.executable, "-m", "pycni.cli", "add", "onlyone"], env=env, capture_output=True)
    assert proc.returncode == 2


@pytest.mark.parametrize("bad", ["A", "A=1;B", "=x"])
def test_malformed_cni_args_are_refused(env, bad):
    proc = subprocess.run(
        [sys.executable, "-m", "pycni.cli", "add", "testnet", "/x"],
        env=env | {"CNI_ARGS": bad},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "invalid CNI_ARGS" in proc.stderr


def test_version(env):
    out = run(["version"], env)
    assert json.loads(out.output)["cniVersion"] == "1.1.0"
    out = run(["version", "fake-a"], env)
    assert json.loads(out.output)["supportedVersions"][-1] == "1.1.0"


def test_conf_list_show_validate(env, tmp_path):
    listing = json.loads(run(["conf", "list"], env).output)
    assert listing == [
        {
            "name": "testnet",
            "cniVersion": "1.1.0",
            "plugins": ["fake-a", "fake-b"],
            "source": str(tmp_path / "net.d" / "10-test.conflist"),
        },
        {
            "name": "nomad",
            "cniVersion": "0.4.0",
            "plugins": ["loopback", "bridge", "firewall", "portmap"],
            "source": "<embedded nomad network>",
            "embedded": True,
        },
    ]
    shown = json.loads(run(["conf", "show", "testnet"], env).output)
    assert shown["plugins"][0]["capabilities"] == {"portMappings": True}
    valid = run(["conf", "validate", str(tmp_path / "net.d" / "10-test.conflist"), "--plugins"], env)
    assert json.loads(valid.output)["capabilities"] == ["portMappings"]


def test_conf_list_reports_a_bad_file_on_stderr_and_lists_the_rest(env, tmp_path):
    bad = tmp_path / "net.d" / "00-bad.conflist"
    bad.write_text("{not json")
    out = CliRunner().invoke(cli, ["conf", "list"], env=env)
    assert out.exit_code == 1
    assert [n["name"] for n in json.loads(out.stdout)] == ["testnet", "nomad"]
    assert out.stderr.startswith(f"pycni: skipped {bad}: error parsing configuration list: ")
    assert out.stderr.count("\n") == 1


def test_conf_list_of_a_dir_that_does_not_exist_is_an_error(env, tmp_path):
    out = CliRunner().invoke(cli, ["conf", "list", "--conf-dir", str(tmp_path / "nope")], env=env)
    assert out.exit_code == 2 and f"{tmp_path / 'nope'} is not a directory" in out.stderr and out.stdout == ""


def test_embedded_default_network_when_conf_dir_lacks_nomad(env, tmp_path):
    shown = json.loads(run(["conf", "show", "nomad", "--conf-dir", str(tmp_path / "empty")], env).output)
    assert [p["type"] for p in shown["plugins"]] == ["loopback", "bridge", "firewall", "portmap"]
    assert shown["plugins"][1]["ipam"]["ranges"] == [[{"subnet": "172.26.64.0/20"}]]


def test_cli_does_not_import_pyroute2_for_runtime_verbs(env):
    code = (
        "import sys; from pycni.cli import main; sys.argv=['pycni','version']\ntry: main()\nexcept SystemExit: pass\n"
        "assert 'pyroute2' not in sys.modules, 'pyroute2 imported'"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)


@pytest.mark.parametrize("argv", [["--help"], ["fuzz", "--help"]])
def test_help_imports_neither_hypothesis_nor_pyroute2(env, argv):
    code = (
        f"import sys; from pycni.cli import main; sys.argv=['pycni', *{argv!r}]\ntry: main()\nexcept SystemExit: pass\n"
        "heavy = [m for m in ('hypothesis', 'pyroute2') if m in sys.modules]\nassert not heavy, heavy"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "fuzz" in proc.stdout


def test_gc_reconcile_prints_its_report_and_dry_run_changes_nothing(env, fake_plugins):
    run(["add", "testnet", "/run/netns/does-not-exist"], env)
    dry = run(["gc", "testnet", "--reconcile", "--dry-run"], env)
    assert dry.exit_code == 0, dry.output
    report = json.loads(dry.output)
    assert report["dryRun"] and report["staleAttachments"][0].startswith(container_id_for("/run/netns/does-not-exist"))
    assert [c["env"]["CNI_COMMAND"] for c in fake_plugins.calls()] == ["ADD", "ADD"]
    real = json.loads(run(["gc", "testnet", "--reconcile"], env).output)
    assert real["staleAttachments"] and not real["dryRun"]
    assert [c["env"]["CNI_COMMAND"] for c in fake_plugins.calls()][2:] == ["DEL", "DEL", "GC", "GC"]


@pytest.mark.parametrize(
    "backend, message",
    [
        ("auto", 'plugin type "no-such-type" is neither built in nor found in path [{dir}]'),
        ("exec", 'failed to find plugin "no-such-type" in path [{dir}]'),
        ("inprocess", 'plugin type "no-such-type" is not built in'),
    ],
)
def test_a_plugin_type_neither_built_in_nor_on_cni_path_is_a_config_error(
    env, fake_plugins, tmp_path, backend, message
):
    confdir = tmp_path / "net.d"
    (confdir / "05-absent.conflist").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "absentnet", "plugins": [{"type": "no-such-type"}]})
    )
    out = CliRunner().invoke(cli, ["add", "absentnet", "/run/netns/x"], env=env | {"PYCNI_BACKEND": backend})
    assert out.exit_code == 1
    expected = message.format(dir=fake_plugins.dir)
    assert out.output.strip() == f'pycni: error (code 7): plugin type="no-such-type" failed (add): {expected}'


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf"])
def test_a_timeout_that_is_not_a_finite_positive_number_is_a_usage_error(env, fake_plugins, value):
    out = run(["add", "testnet", "/run/netns/x", "--timeout", value], env)
    assert out.exit_code == 2 and "--timeout" in out.output
    assert fake_plugins.calls() == []


@pytest.mark.parametrize("verb", [["add", "absentnet", "/run/netns/x"], ["conf", "validate", "PATH", "--plugins"]])
def test_without_cni_path_every_verb_searches_the_one_default_plugin_path(env, tmp_path, verb):
    conf = tmp_path / "net.d" / "05-absent.conflist"
    conf.write_text(json.dumps({"cniVersion": "1.0.0", "name": "absentnet", "plugins": [{"type": "no-such-type"}]}))
    env = env | {"CNI_PATH": None, "PYCNI_BACKEND": "exec"}  # None: unset
    argv = [str(conf) if a == "PATH" else a for a in verb]
    out = CliRunner().invoke(cli, argv, env=env)
    assert out.exit_code == 1
    assert 'failed to find plugin "no-such-type" in path [/opt/cni/bin /usr/lib/cni]' in out.output


@pytest.mark.parametrize("verb", [["demo"], ["nomad", "setup"], ["inspect"], ["add"]])
def test_every_verb_shows_the_same_default_plugin_path(verb):
    out = CliRunner().invoke(cli, [*verb, "--help"])
    assert "[default: /opt/cni/bin:/usr/lib/cni]" in " ".join(out.output.split())


@pytest.mark.parametrize(
    "verb, absent",
    [
        ("version", ["--conf-dir", "--ifname", "--container-id", "--args", "--cap-args", "--cache-dir", "--state-dir"]),
        ("status", ["--ifname", "--container-id", "--args", "--cap-args", "--cache-dir"]),
        ("gc", ["--ifname", "--container-id", "--args", "--cap-args"]),
    ],
)
def test_verbs_offer_only_the_options_they_use(verb, absent):
    options = {p.opts[0] for p in cli.commands[verb].params if isinstance(p, click.Option)}
    assert options and not options & set(absent)


def test_check_and_status_confirm_on_a_terminal_and_stay_silent_for_scripts(env, monkeypatch):
    from pycni.cli import runtime_commands

    run(["add", "testnet", "/run/netns/x"], env)
    assert run(["check", "testnet", "/run/netns/x"], env).output == ""
    assert run(["status", "testnet"], env).output == ""
    monkeypatch.setattr(runtime_commands, "on_terminal", lambda: True)
    checked = run(["check", "testnet", "/run/netns/x"], env).output
    assert checked == f"testnet: {container_id_for('/run/netns/x')}/eth0 checks out\n"
    assert run(["status", "testnet"], env).output == "testnet: ready (2 plugin(s) answered STATUS)\n"
