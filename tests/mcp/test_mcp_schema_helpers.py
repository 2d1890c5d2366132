"""mcp.schema's error text: what is wrong and where, never the submitted value (which may be a secret)."""

import pytest

from mcp.schema import array, enum, error_path, error_text, first_error, integer, obj, string

SCHEMA = obj({"token": string(16, pattern="^[a-z]+$"), "mode": enum(["a", "b"]), "n": integer(0, 9),
              "tags": array(string(8), max_items=1)}, ["mode"])


@pytest.mark.parametrize(("value", "path", "needle"), [
    ({"mode": "a", "token": "s" * 40}, "/token", "the value is too long"),
    ({"mode": "a", "token": "S3CRET"}, "/token", "the value does not match '^[a-z]+$'"),
    ({"mode": "s3cret"}, "/mode", "the value is not one of ['a', 'b']"),
    ({"mode": "a", "n": 10}, "/n", "the value is greater than the maximum of 9"),
    ({"mode": "a", "tags": ["s3cret", "x"]}, "/tags", "the value is too long"),
    ({}, "/", "'mode' is a required property"),
    ({"mode": "a", "s3cret": 1}, "/", "('s3cret' was unexpected)"),  # the caller's own key, not a value
])
def test_error_text_names_the_rule_not_the_value(value, path, needle):
    error = first_error(SCHEMA, value)
    assert error is not None and error_path(error) == path
    text = error_text(error)
    assert needle in text
    if path != "/":
        assert "s3cret" not in text.lower() and "ssss" not in text
