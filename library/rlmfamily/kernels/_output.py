"""Printed output of one step: the first ``max_bytes`` kept, the rest counted and dropped.

Monty's own collectors fail the whole feed when their cap is exceeded; this one
never fails, so a huge print costs the tail of the output, not the step.
"""

from __future__ import annotations


def utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class CappedOutput:
    def __init__(self, max_bytes: int, *, initial: str = "", initial_bytes: int = 0, truncated: bool = False) -> None:
        self.max_bytes = max_bytes
        self._parts: list[str] = [initial] if initial else []
        self._kept = utf8_len(initial)
        self.total_bytes = max(initial_bytes, self._kept)
        self.truncated = truncated

    def write(self, text: str) -> None:
        size = utf8_len(text)
        self.total_bytes += size
        room = self.max_bytes - self._kept
        if room <= 0:
            if size:
                self.truncated = True
            return
        if size <= room:
            self._parts.append(text)
            self._kept += size
            return
        head = text.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
        self._parts.append(head)
        self._kept += utf8_len(head)
        self.truncated = True

    def __call__(self, stream: str, text: str) -> None:
        """Monty's print callback signature: (stream, text)."""
        self.write(text)

    @property
    def text(self) -> str:
        return "".join(self._parts)
