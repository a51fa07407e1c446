"""Whole numbers read as integers in every JSON the edge writes: ``"creditsCharged": 5``, not ``5.0``.

Cards, task and message metadata, data parts and extension params are protobuf
``Struct``/``Value``, whose only number is a double: protobuf's ``json_format``
(which the a2a-sdk uses for every JSON answer, SSE event and 0.3 conversion)
prints ``5`` back as ``5.0``. A customer that reads ``tariffCredits`` or a finding's
``line`` as an integer (a strict schema, ``int`` in Go, ``Number.isInteger``) then
fails, although the service only ever meant an integer.

``install()`` makes ``json_format`` print a whole-valued ``Value.number_value``
within ±2**53 (every integer a double holds exactly) as an ``int``; other numbers
(``2.5``, ``1e300``, ``2**53 + 2``) print as before. It patches the one private
method every ``Struct``/``ListValue``/``Value`` goes through
(``json_format._Printer._ValueMessageToJsonObject``), once, when the edge is
built; if a protobuf release renamed it, or no longer routes numbers through it,
``install()`` raises ``IntegerPrintingUnavailable`` and the edge does not start.
Typed integer fields (``int32``) were never affected; gRPC carries the double
itself. ``metadata_text`` applies the same rule where numbers become strings
(``ErrorInfo.metadata`` is a map of strings).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

MAX_EXACT_INTEGER = 2**53  # doubles hold every integer up to here exactly; past it, a whole double may be a rounding
_PRINTER_METHOD = "_ValueMessageToJsonObject"
_INSTALLED_MARK = "_specialists_whole_numbers_as_integers"


class IntegerPrintingUnavailable(RuntimeError):
    """The installed protobuf no longer has the printer hook this module patches: upgrade this module with it."""


def as_integer_if_whole(value: Any) -> Any:
    """``5.0`` -> ``5``; ``2.5``, ``2.0**60``, ``nan``, and anything not a float unchanged."""
    if type(value) is float and value.is_integer() and abs(value) <= MAX_EXACT_INTEGER:
        return int(value)
    return value


def metadata_text(value: object) -> str:
    """A detail as ErrorInfo metadata carries it: ``5.0`` -> ``"5"``, like every other whole number."""
    return str(as_integer_if_whole(value))


def install() -> None:
    """Patch protobuf's JSON printer once (idempotent); raise if it cannot be patched or the patch does not hold."""
    printer = getattr(json_format, "_Printer", None)
    original = getattr(printer, _PRINTER_METHOD, None)
    if printer is None or original is None:
        raise IntegerPrintingUnavailable(
            f"google.protobuf.json_format._Printer.{_PRINTER_METHOD} is gone in this protobuf release; "
            "app/integers.py must be adapted, or every whole number would reach customers as a float"
        )
    if not getattr(original, _INSTALLED_MARK, False):

        def value_to_json(self: Any, message: Any) -> Any:
            return as_integer_if_whole(original(self, message))

        setattr(value_to_json, _INSTALLED_MARK, True)
        value_to_json.__doc__ = original.__doc__
        setattr(printer, _PRINTER_METHOD, value_to_json)
    _verify()


def _verify() -> None:
    probe = Struct()
    probe.update({"whole": 5, "nested": {"list": [3]}, "fraction": 2.5})
    printed = json_format.MessageToDict(probe)
    expected = {"whole": 5, "nested": {"list": [3]}, "fraction": 2.5}
    if printed != expected or type(printed["whole"]) is not int or type(printed["nested"]["list"][0]) is not int:
        raise IntegerPrintingUnavailable(
            f"protobuf's JSON printer no longer goes through _Printer.{_PRINTER_METHOD} for Struct values "
            f"(a Struct of 5 printed as {printed!r}); app/integers.py must be adapted"
        )
