"""The libnftables binding behind pycni._libnftables: what it does without the kernel, and a missing library."""

from __future__ import annotations

import pytest

from pycni import _libnftables
from pycni._libnftables import LibnftablesMissing, Nftables
from pycni.errors import ErrorCode


def test_a_missing_library_is_code_50_naming_the_package_to_install(monkeypatch):
    monkeypatch.setattr(_libnftables, "SONAME", "libnftables-missing.so.0")
    with pytest.raises(LibnftablesMissing) as e:
        Nftables()
    assert e.value.code == ErrorCode.PLUGIN_NOT_AVAILABLE == 50
    assert (
        e.value.msg
        == "libnftables-missing.so.0 not found: install libnftables (Debian/Ubuntu: apt install libnftables1)"
    )
    assert "libnftables-missing.so.0" in e.value.details  # dlopen's own text


def test_a_missing_library_leaves_no_teardown_warning(monkeypatch, recwarn):
    monkeypatch.setattr(_libnftables, "SONAME", "libnftables-missing.so.0")
    with pytest.raises(LibnftablesMissing):
        Nftables()
    import gc

    gc.collect()  # the half-made context's __del__ runs here; pytest turns its warning into an error


def test_output_flags_report_their_previous_setting():
    nft = Nftables()
    for setter in (nft.set_json_output, nft.set_handle_output, nft.set_stateless_output):
        # The binding answers with the flag's bit: truthy when it was on.
        assert not setter(True)
        assert setter(True)
        assert setter(False)
        assert not setter(False)


def test_json_cmd_restores_text_output_and_reports_errors_on_stderr():
    nft = Nftables()
    rc, out, err = nft.json_cmd({"nftables": [{"frobnicate": {}}]})
    assert rc != 0 and out == "" and "Parsing command array at index 0 failed" in err
    assert not nft.set_json_output(False)  # json_cmd put text output back


def test_a_syntax_error_is_a_nonzero_rc_with_the_parsers_message():
    rc, out, err = Nftables().cmd("add tabel inet x")
    assert rc != 0 and out == "" and "syntax error" in err
