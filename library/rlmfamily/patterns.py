"""Search patterns from the model's code, compiled for a linear-time engine (RE2) and bounded.

Python's ``re`` backtracks: ``(a+)+$`` against 29 ``a`` and a ``!`` takes about
100 s, holding the GIL throughout, so no deadline thread can even run. RE2 runs
in time linear in the text (times the compiled program's size), releases the
GIL while it matches, and refuses what needs backtracking (backreferences,
lookaround). This module owns that choice:

- ``compile_pattern`` refuses a pattern over ``max_search_pattern_chars`` or whose
  compiled program is over ``max_search_program_size`` instructions, and says
  what RE2 does not support in a ``PatternUnsupported`` (code
  ``pattern_unsupported``); a pattern neither engine parses is a plain
  ``ContextError`` ("invalid regular expression").
- ``Pattern.spans`` yields matches as *character* offsets of a ``str``, with
  Python's ``re.finditer`` rules for empty matches, in one pass over the text.

The work of one ``Match`` call is not interruptible; its worst case, when RE2's
DFA gives up and its NFA runs, measured about 4.5 ns per byte per program
instruction (bench/search_patterns.py). The caller checks its own deadline
between calls (``Context.search``: ``search_timeout_s``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import re2

from rlmfamily.errors import ContextError, PatternUnsupported
from rlmfamily.settings import RLMSettings

# Every UTF-8 continuation byte (10xxxxxx): deleting them leaves one byte per character.
_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))

# What RE2 says, and what it means for the person who wrote the pattern. Checked in order.
_UNSUPPORTED = (
    ("invalid perl operator: (?=", "lookahead (?=...)"),
    ("invalid perl operator: (?!", "negative lookahead (?!...)"),
    ("invalid perl operator: (?<=", "lookbehind (?<=...)"),
    ("invalid perl operator: (?<!", "negative lookbehind (?<!...)"),
    ("invalid perl operator: (?>", "atomic groups (?>...)"),
    ("invalid perl operator: (?P=", "named backreferences (?P=name)"),
    ("invalid perl operator: (?P", "named backreferences (?P=name)"),
    ("invalid perl operator: (?#", "comments (?#...)"),
    ("invalid perl operator: (?x", "verbose mode (?x)"),
    ("bad repetition operator: ++", "possessive quantifiers (++, *+, ?+)"),
    ("bad repetition operator: *+", "possessive quantifiers (++, *+, ?+)"),
    ("bad repetition operator: ?+", "possessive quantifiers (++, *+, ?+)"),
    ("invalid escape sequence: \\Z", "\\Z (write \\z for the end of the text)"),
    ("invalid repetition size", "repetition counts over 1000, also when nested ones multiply past it"),
    ("pattern too large", "a pattern this large (its compiled program exceeds the engine's memory)"),
)
_BACKREFERENCE = re.compile(r"invalid escape sequence: \\[1-9]")


@dataclass(frozen=True)
class Pattern:
    """A compiled search pattern: MULTILINE (``^``/``$`` at line ends), never capturing."""

    source: str
    program_size: int
    _regexp: Any

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        """(start, end) character offsets of the matches in ``text``, left to right, as ``re.finditer`` gives them.

        After an empty match the search moves on one character, so it always ends.
        Offsets are converted from RE2's byte offsets incrementally (each byte of the
        text is counted once), not by re-encoding the text per match.
        """
        data = text.encode("utf-8", "surrogatepass")  # bundle text may hold lone surrogates
        size = len(data)
        pos = 0
        counted_bytes = counted_chars = 0  # the prefix converted so far

        def chars_at(offset: int) -> int:
            nonlocal counted_bytes, counted_chars
            counted_chars += len(data[counted_bytes:offset].translate(None, _CONTINUATION_BYTES))
            counted_bytes = offset
            return counted_chars

        while pos <= size:
            match = self._regexp.search(data, pos)
            if match is None:
                return
            start, end = match.span()
            yield chars_at(start), chars_at(end)
            if end > start:
                pos = end
            elif end < size:
                pos = end + _utf8_length(data[end])
            else:
                return


def _utf8_length(lead: int) -> int:
    if lead < 0xC0:
        return 1  # ASCII (or a stray continuation byte: step over it alone)
    if lead < 0xE0:
        return 2
    if lead < 0xF0:
        return 3
    return 4


def compile_pattern(pattern: Any, settings: RLMSettings) -> Pattern:
    """The pattern compiled for RE2 within the settings' caps, or a refusal that says what to change."""
    if not isinstance(pattern, str):
        raise ContextError(f"search takes the pattern as a string, not {type(pattern).__name__}")
    cap = settings.max_search_pattern_chars
    if len(pattern) > cap:
        raise PatternUnsupported(
            f"the pattern is {len(pattern):,} characters; search takes at most {cap:,} "
            "(RLM_MAX_SEARCH_PATTERN_CHARS). Search for a shorter, more specific pattern",
            setting="max_search_pattern_chars",
        )
    options = re2.Options()
    options.never_capture = True  # only the whole match is reported, and RE2 is fastest without groups
    options.log_errors = False
    options.max_mem = settings.max_search_pattern_memory_bytes
    try:
        # Not re2.compile: it keeps the last 128 patterns (each up to max_mem) in a process-wide cache.
        regexp = re2._Regexp("(?m)" + pattern, options)
    except re2.error as exc:
        raise _refusal(pattern, _text(exc)) from None
    program_size = int(regexp.programsize)
    limit = settings.max_search_program_size
    if program_size > limit:
        raise PatternUnsupported(
            f"the pattern compiles to {program_size:,} instructions; search runs at most {limit:,} "
            "(RLM_MAX_SEARCH_PROGRAM_SIZE). Large Unicode classes (\\p{L}) and counted repeats (x{500}) are what "
            "grow it: use fewer of them, or search for a literal and read around the hits",
            setting="max_search_program_size",
        )
    return Pattern(pattern, program_size, regexp)


def _refusal(pattern: str, reason: str) -> ContextError:
    for marker, feature in _UNSUPPORTED:
        if marker in reason:
            return _unsupported(pattern, feature)
    if _BACKREFERENCE.search(reason):
        return _unsupported(pattern, "backreferences (\\1)")
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return ContextError(f"invalid regular expression {pattern!r}: {reason}")
    # Python's re takes it and RE2 does not: say so rather than call it invalid.
    return _unsupported(pattern, f"this syntax ({reason})")


def _unsupported(pattern: str, feature: str) -> PatternUnsupported:
    return PatternUnsupported(
        f"search patterns run on a linear-time engine (RE2), which does not support {feature}; "
        f"pattern {pattern!r}. Rewrite it without that (search for a wider pattern and filter the hits "
        "in your code)"
    )


def _text(exc: BaseException) -> str:
    detail = exc.args[0] if exc.args else exc
    return detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
