"""Properties of the Go-rules field reader (pycni._json.GoReader): whatever the decoded JSON, a
typed read returns its Go type or raises GoValueError, and a key reaches its field as Go's does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pycni._json import INT64, GoFields, GoReader, GoValueError, dumps_compact, go_field, go_fold, go_kind, kind, loads
from pycni.strategies import json_values

SETTINGS = settings(max_examples=300, deadline=None, database=None)

READS = {
    "string": (str, "a string"),
    "integer": (int, "an integer"),
    "flag": (bool, "a boolean"),
    "mapping": (dict, "an object"),
    "array": (list, "an array"),
}


@SETTINGS
@given(value=json_values, read=st.sampled_from(sorted(READS)))
def test_a_typed_read_gives_its_go_type_or_a_go_value_error(value, read):
    kind_of, wanted = READS[read]
    try:
        got = getattr(GoReader({"field": value}, "T"), read)("field")
    except GoValueError as e:
        assert e.field == "T.field" and e.where() == "field"
        assert e.go_message().startswith(f"json: cannot unmarshal {go_kind(value)}")
        assert e.go_message().endswith("into Go struct field T.field of type " + e.go_type)
        if e.bounds is None:
            assert e.problem().startswith(f"expected {wanted}, got ")
            assert value is not None and (isinstance(value, float) or kind(value) != kind(kind_of()))
        else:
            assert read == "integer" and not INT64[0] <= value <= INT64[1]
        return
    assert type(got) is kind_of
    if value is not None:
        assert type(value) is kind_of


@SETTINGS
@given(
    field=st.text("abks", min_size=1, max_size=5), key=st.text("abksABKS\u017f\u212a", max_size=5), value=st.integers()
)
def test_a_key_reaches_the_field_exactly_or_under_gos_folding(field, key, value):
    got = GoReader({key: value}).get(field)
    assert (got == value) == (go_fold(key) == field)


_KEYS = st.text("abksABKS\u017f\u212a", max_size=4)


@SETTINGS
@given(
    field=st.text("abks", min_size=1, max_size=4),
    pairs=st.lists(st.tuples(_KEYS, st.integers(0, 9)), max_size=6),
)
def test_one_pass_field_reads_give_what_gos_struct_decoder_leaves(field, pairs):
    # go_field and GoReader read every field from one folded pass over the object; Go decodes
    # each key in document order into the field it reaches (GoFields), the last one winning.
    obj = loads("{" + ",".join(f"{dumps_compact(k)}:{v}" for k, v in pairs) + "}")  # Repeated if keys repeat
    expected = dict(GoFields(field).pairs(obj)).get(field)
    assert go_field(obj, field) == expected
    assert GoReader(obj).get(field) == expected


@SETTINGS
@given(text=st.text(alphabet=st.sampled_from('ab"\\<>&\u2028\u2029\u00e9\ud800\udfff\n')) | st.text())
def test_go_escape_is_the_html_escapes_then_surrogates_replaced_whatever_the_text(text):
    # The ASCII fast path must give what the general path gives.
    from pycni._json import _GO_ESCAPES, _SURROGATE, go_escape

    assert go_escape(text) == _SURROGATE.sub("\ufffd", text.translate(_GO_ESCAPES))
