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
   finite (``NaN``, ``Infinity``, ``1e999``), which protobuf cannot hold. A body
   with no digit and no ``N`` or ``I`` outside its strings holds no number to
   refuse, and is not parsed for it (a send's message is strings: 0.6 ms of a
   464 KB send, issue 44).

Cost (bench/edge_bodies.py, load 4.7 on 2 cores; docs/BENCHMARKS.md): 9 ms for
2 MiB of text and 14 ms for 2 MiB of commas inside a string (the worst for the
exact count), against the SDK's 95 ms and 89 ms parse of the same bodies; 4 ms for
20,000 values (the SDK: 37 ms); 3-4 ms to refuse the issue's two bodies. Whether
the text is valid JSON at all is left to the protocol layer, which answers that
with its own parse error.

A gRPC request arrives as protobuf, parsed in C; ``check_parsed`` gives it the
same element bound and the same refusal of non-finite numbers.
"""

from __future__ import annotations

import json
import math

from google.protobuf.message import Message
from google.protobuf.struct_pb2 import Struct, Value

from app.errors import InvalidValue, PayloadTooLarge
from core.settings import EdgeSettings

_WHITESPACE = b" \t\r\n"


def count_elements(body: bytes, max_elements: int) -> int:
    """The body's JSON values, exactly when it may be over ``max_elements``; refuse it when it is.

    Every value is the root, follows a comma, or is the first member of a container,
    so commas and opening brackets bound the count from above. Only when that bound
    is over the cap are strings set aside and the exact count taken, first on a prefix
    just long enough to hold an eighth more than the cap if the bound is right (a
    prefix holds no more values than the body), then on prefixes twice as long: a
    body of 100,000 parts is refused after 170 KB of it were read.
    """
    bound = 1 + _structural(body)
    if bound <= max_elements:
        return bound
    end = min(len(body), len(body) * 9 * max_elements // (8 * bound) + 1)
    while True:
        bare = outside_strings(body[:end]).translate(None, _WHITESPACE)
        elements = 1 + _structural(bare) - bare.count(b"[]") - bare.count(b"{}")
        if end < len(body) and bare.endswith((b"[", b"{")):
            elements -= 1  # the cut may have split an empty container
        if elements > max_elements:
            raise PayloadTooLarge(
                f"the request body holds {'over ' if end < len(body) else ''}{elements} JSON values; at most "
                f"{max_elements} are accepted (SPECIALISTS_MAX_BODY_ELEMENTS)",
                code="body_elements_over_limit",
                limit="max_body_elements",
            )
        if end == len(body):
            return elements
        end = min(len(body), end * 2)


class ElementCounter:
    """``count_elements`` while the body arrives: a body over the cap is refused without reading the rest.

    The upper bound grows with each chunk, in C; the exact count of what has arrived (a
    lower bound of the body's) is taken only when the bound has doubled since the last
    one, so a body is scanned a few times at most.
    """

    def __init__(self, max_elements: int) -> None:
        self.max_elements = max_elements
        self.bound = 1
        self._next_exact = max_elements

    def feed(self, received: list[bytes], chunk: bytes) -> None:
        """``received``: the chunks so far, ``chunk`` the last of them."""
        self.bound += _structural(chunk)
        if self.bound > self._next_exact:
            count_elements(b"".join(received), self.max_elements)
            self._next_exact = 2 * self.bound


# Everything but the three bytes that start a value: deleting them leaves those to count, in one pass.
_NOT_STRUCTURAL = bytes(byte for byte in range(256) if byte not in b",[{")


def _structural(text: bytes) -> int:
    return len(text.translate(None, _NOT_STRUCTURAL))


def outside_strings(body: bytes) -> bytes:
    """The body's bytes outside JSON strings, in C: escapes dropped, then every other piece between quotes.

    Escaped backslashes go first, so that what is left of a backslash run escapes the
    character after it exactly as JSON reads it; then an escaped quote is no delimiter.
    (A regex over the strings cost 45 ms on 100,000 of them; this, about 10.)
    """
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(body.split(b'"')[::2])


# What every number literal outside strings shows (a digit; ``NaN``, ``Infinity``, ``-Infinity``), and what else.
_NUMBER_MARKS = b"0123456789NI"
_NOT_NUMBER_MARKS = bytes(set(range(256)) - set(_NUMBER_MARKS))


def check_numbers(body: bytes, edge: EdgeSettings, outside: bytes | None = None) -> None:
    """Refuse a number literal the service cannot hold: too long, or not finite.

    ``outside``: the body's bytes outside strings (``outside_strings``), when the caller has them. Without a number
    mark among them the body is not parsed: the parser would meet no number before its end or its first syntax
    error (up to which the bytes outside strings are told as the parser tells them), so nothing would be refused."""
    if outside is not None and not outside.translate(None, _NOT_NUMBER_MARKS):
        return
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


# --- the same bounds on a parsed protobuf request (the gRPC binding) ---------------------------------


def check_parsed(request: Message, edge: EdgeSettings) -> int:
    """The values of a parsed A2A request (gRPC), against ``max_body_elements``; non-finite numbers refused.

    A binary request is parsed in C, but what comes next walks it in Python (the SDK's
    required-field check, admission, the store's JSON), so it is bounded as a JSON body
    is: the message's parts and every ``Struct``/``Value`` (request and message metadata,
    data parts, part metadata) count, and the walk stops as soon as the count is over.
    A ``Value`` can hold NaN or infinity in binary, which JSON cannot: refused as over HTTP.
    """
    counter = _ParsedCounter(edge.max_body_elements)
    counter.add(1)
    if "metadata" in request.DESCRIPTOR.fields_by_name:
        counter.struct(getattr(request, "metadata"), "metadata")
    message = getattr(request, "message", None) if "message" in request.DESCRIPTOR.fields_by_name else None
    if message is not None:
        counter.add(len(message.parts))
        for index, part in enumerate(message.parts):
            if part.HasField("data"):
                counter.value(part.data, f"message.parts[{index}].data")
            if part.HasField("metadata"):
                counter.struct(part.metadata, f"message.parts[{index}].metadata")
        counter.struct(message.metadata, "message.metadata")
    return counter.count


class _ParsedCounter:
    def __init__(self, max_elements: int) -> None:
        self.max_elements = max_elements
        self.count = 0

    def add(self, elements: int) -> None:
        self.count += elements
        if self.count > self.max_elements:
            raise PayloadTooLarge(
                f"the request holds over {self.max_elements} values (parts, and the values of its metadata and "
                "data); at most that many are accepted (SPECIALISTS_MAX_BODY_ELEMENTS)",
                code="body_elements_over_limit",
                limit="max_body_elements",
            )

    def struct(self, struct: Struct, path: str) -> None:
        self.add(1)
        for key, item in struct.fields.items():
            self.value(item, f"{path}.{key}")

    def value(self, value: Value, path: str) -> None:
        kind = value.WhichOneof("kind")
        if kind == "struct_value":
            self.struct(value.struct_value, path)
            return
        self.add(1)
        if kind == "list_value":
            for index, item in enumerate(value.list_value.values):
                self.value(item, f"{path}[{index}]")
        elif kind == "number_value" and not math.isfinite(value.number_value):
            raise InvalidValue(
                f"{path} is {value.number_value}, which JSON cannot hold; send a finite number, or a string",
                code="number_not_finite",
            )
