"""How deep a body's JSON nests, read from its bytes before anything parses it (app/middleware.py, ``json_depth``).

The model is the parsed value's own depth: for any JSON document, its strings holding brackets, quotes,
backslashes and escapes, printed either way (``ensure_ascii`` on or off, compact or spaced), the depth read
from the bytes is the document's. Over the wire, a body one level past SPECIALISTS_MAX_JSON_DEPTH is refused,
one at it is not, though its strings hold more brackets than the limit. The same guard's NUL check still finds
the escape in either case, and not an escaped backslash before a ``u``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import MalformedRequest
from app.middleware import check_json_text, json_depth
from tests import http_calls
from tests.app.conftest import PAID, message

MODEL = settings(max_examples=400, deadline=None, derandomize=True, database=None)
MAX_JSON_DEPTH = 100  # SPECIALISTS_MAX_JSON_DEPTH's default, which the shared test edges run with

_tricky_text = st.text(alphabet=st.sampled_from(list('[]{}"\\ab,: \n\u00e9\u2603/')), max_size=12)
_documents = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | _tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_tricky_text, inner, max_size=4),
    max_leaves=30,
)


def depth_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


@MODEL
@given(_documents, st.booleans(), st.booleans())
def test_the_depth_read_from_the_bytes_is_the_documents(document, ascii_only, spaced):
    separators = (", ", ": ") if spaced else (",", ":")
    body = json.dumps(document, ensure_ascii=ascii_only, separators=separators).encode()
    assert json_depth(body) == depth_of(document)


def _nested_metadata(levels: int) -> dict:
    """``levels`` objects inside one another, each with a string of brackets beside the next."""
    value: dict = {"leaf": "[[[{{{" * 40}
    for _ in range(levels - 1):
        value = {"brackets": "]]]}}}[[[" * 20, "next": value}
    return value


@pytest.mark.parametrize("over", [False, True])
def test_a_body_one_level_past_the_limit_is_refused_and_one_at_it_is_not(edge_a, make_customer, over):
    customer = make_customer(credits=100, max_parallel=2)
    sent = message()
    # The body and the message are two levels: the metadata's objects make up the rest.
    sent["message"]["metadata"] = _nested_metadata(MAX_JSON_DEPTH - 2 + (1 if over else 0))
    body = json.dumps(sent).encode()
    assert json_depth(body) == MAX_JSON_DEPTH + (1 if over else 0)
    answer = http_calls.post(f"{edge_a.specialist(PAID)}/message:send", content=body,
                             headers={**customer.headers, "Content-Type": "application/json"})
    code = answer.json()["error"]["details"][0]["metadata"].get("code") if answer.status_code >= 400 else None
    if over:
        assert (answer.status_code, code) == (400, "malformed_request"), answer.text
        assert "SPECIALISTS_MAX_JSON_DEPTH" in answer.json()["error"]["message"]
    else:
        assert code != "malformed_request", answer.text


@pytest.mark.parametrize("escape, refused", [(rb"\u0000", True), (rb"\U0000", True), (rb"\\u0000", False),
                                             (rb"\\\u0000", True)])
def test_a_nul_escape_is_refused_in_either_case_and_an_escaped_backslash_is_not(escape, refused):
    body = b'{"message": {"messageId": "m-' + escape + b'"}}'
    if refused:
        with pytest.raises(MalformedRequest, match="NUL"):
            check_json_text(body, MAX_JSON_DEPTH)
    else:
        check_json_text(body, MAX_JSON_DEPTH)
