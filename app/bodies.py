"""What an A2A request body may hold, checked on the raw bytes before anything parses it.

The a2a-sdk parses a body with protobuf's pure-Python ``json_format`` and then
walks the message for required fields, on the event loop, before the edge's
handler counts anything: 100,000 ``{"text":"a"}`` parts held one instance for
2.2 s on an idle machine, 9 s on a loaded one (issue 15), and its ``/healthz``
with it. The guard (app/middleware.py) therefore bounds the body itself, after
its byte cap and before the SDK sees it:

1. ``count_elements``: the JSON values of the body (objects, arrays, strings,
   numbers, literals; object keys are not values) against ``max_body_elements``.
   Counted with ``bytes.count`` and the regex engine, in C: an upper bound from
   commas and opening brackets first, and only when that is over the cap, the
   exact count outside strings.
2. ``check_numbers``: the C ``json`` parser, with hooks that refuse a number
   literal longer than ``max_json_number_chars`` (Python refuses to convert an
   integer of 4,300 digits, with a message of its own) and any number that is not
   finite (``NaN``, ``Infinity``, ``1e999``), which protobuf cannot hold.

Cost on the largest admissible body (bench/edge_bodies.py prints it): well under
the 50 ms the edge promises ``/healthz``; the figures are in docs/BENCHMARKS.md.
Whether the text is valid JSON at all is left to the protocol layer, which
answers that with its own parse error.
"""

from __future__ import annotations

import json
import math

from app.errors import InvalidValue, PayloadTooLarge
from core.settings import EdgeSettings

_WHITESPACE = b" \t\r\n"


def count_elements(body: bytes, max_elements: int) -> int:
    """The body's JSON values, exactly when it may be over ``max_elements``; refuse it when it is."""
    # Every value is the root, or follows a comma, or is the first member of a container.
    bound = 1 + body.count(b",") + body.count(b"[") + body.count(b"{")
    if bound <= max_elements:
        return bound
    bare = outside_strings(body).translate(None, _WHITESPACE)
    empty = bare.count(b"[]") + bare.count(b"{}")
    elements = 1 + bare.count(b",") + bare.count(b"[") + bare.count(b"{") - empty
    if elements > max_elements:
        raise PayloadTooLarge(
            f"the request body holds {elements} JSON values; at most {max_elements} are accepted "
            "(SPECIALISTS_MAX_BODY_ELEMENTS)",
            code="body_elements_over_limit",
            limit="max_body_elements",
        )
    return elements


def outside_strings(body: bytes) -> bytes:
    """The body's bytes outside JSON strings, in C: escapes dropped, then every other piece between quotes.

    Escaped backslashes go first, so that what is left of a backslash run escapes the
    character after it exactly as JSON reads it; then an escaped quote is no delimiter.
    (A regex over the strings cost 45 ms on 100,000 of them; this, about 10.)
    """
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(body.split(b'"')[::2])


def check_numbers(body: bytes, edge: EdgeSettings) -> None:
    """Refuse a number literal the service cannot hold: too long, or not finite."""
    max_chars = edge.max_json_number_chars

    def integer(literal: str) -> int:
        if len(literal) > max_chars:
            raise _too_long(literal, max_chars)
        return int(literal)

    def real(literal: str) -> float:
        if len(literal) > max_chars:
            raise _too_long(literal, max_chars)
        value = float(literal)
        if not math.isfinite(value):
            raise InvalidValue(
                f"the number {literal} is beyond what a double holds; send a finite number",
                code="number_not_finite",
            )
        return value

    def constant(name: str) -> float:
        raise InvalidValue(
            f"{name} is not a JSON number (RFC 8259); send a finite number, or a string", code="number_not_finite"
        )

    try:
        json.loads(body, parse_int=integer, parse_float=real, parse_constant=constant)
    except json.JSONDecodeError:  # not JSON: the protocol layer answers that with its own parse error
        return


def _too_long(literal: str, max_chars: int) -> InvalidValue:
    return InvalidValue(
        f"a number in the body has {len(literal)} characters; at most {max_chars} are accepted "
        "(SPECIALISTS_MAX_JSON_NUMBER_CHARS): send long numbers as strings",
        code="number_too_long",
        limit="max_json_number_chars",
    )
