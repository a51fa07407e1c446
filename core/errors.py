"""The base error of the service: a stable machine-readable code and a message a person can act on.

Every error of the project has this one shape (``rlmfamily.errors.RLMError`` and
``app.errors.EdgeError`` too): ``code`` on the instance is the specific reason,
lower snake case, what callers and tests switch on; ``message`` says what to do;
``to_dict()`` is ``{"code", "message"}`` plus ``details`` when there are any.
The wire form (HTTP status, JSON-RPC code, CLI exit code) is chosen at the edge.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    code: str = "service_error"  # the class's default reason; an instance may carry a more specific one

    def __init__(self, message: str, *, code: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or type(self).code
        self.details = details

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            data["details"] = self.details
        return data
