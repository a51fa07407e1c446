"""The guard's number check (app/bodies.py, ``check_numbers``) skips its parse of a body with no number mark
outside its strings, and refuses exactly what it refused with the parse: for any document, its strings full of
digits, quotes, backslashes and escapes, its numbers long or not finite, whole or cut short or with a stray byte
(where the parser stops early), the outcome with the bytes outside strings given is the outcome without them."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.bodies import check_numbers, outside_strings
from app.errors import EdgeError
from core.settings import Settings

MODEL = settings(max_examples=600, deadline=None, derandomize=True, database=None)
EDGE = Settings().edge

_tricky_text = st.text(alphabet=st.sampled_from(list('0123456789NaIf[]{}"\\ab,:-.e \n\u00e9')), max_size=12)
_numbers = (st.integers(-10**6, 10**6) | st.integers(-10**80, 10**80)
            | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([1e308, -1e-308, 0.5]))
_documents = st.recursive(
    st.none() | st.booleans() | _numbers | _tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_tricky_text, inner, max_size=4),
    max_leaves=30,
)


def outcome(body: bytes, outside: bytes | None) -> str:
    try:
        check_numbers(body, EDGE, outside)
    except EdgeError as refused:
        return refused.code
    return "accepted"


@MODEL
@given(_documents, st.booleans(), st.integers(0, 400), st.sampled_from([b"", b"\\", b'"', b"1" * 400, b"NaN", b"x"]))
def test_the_check_refuses_the_same_with_or_without_its_parse(document: Any, ascii_only: bool, cut: int,
                                                               stray: bytes) -> None:
    whole = json.dumps(document, ensure_ascii=ascii_only).encode()
    for body in (whole, whole[:cut] + stray + whole[cut:]):
        assert outcome(body, outside_strings(body)) == outcome(body, None), body


def test_a_body_whose_numbers_are_all_inside_strings_is_accepted_unparsed() -> None:
    body = json.dumps({"message": {"parts": [{"text": "1" * 5000 + " NaN Infinity"}]}}).encode()
    outside = outside_strings(body)
    assert not any(mark in outside for mark in b"0123456789NI")  # nothing the parse could refuse
    assert outcome(body, outside) == "accepted"
