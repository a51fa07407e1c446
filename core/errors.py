"""The base error of the service: a stable machine-readable code and a message a person can act on.

The wire form (HTTP status, JSON-RPC code, CLI exit code) is chosen at the edge.
"""

from __future__ import annotations


class ServiceError(Exception):
    code: str = "service_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}
