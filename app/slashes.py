"""One trailing slash is the same address: ``…/jsonrpc/`` is ``…/jsonrpc``, on every route, without a redirect.

Starlette answers a path that matches only with its slash toggled by a ``307`` with an
empty body (``redirect_slashes``). Clients that do not follow redirects (httpx by
default; the A2A TCK posts JSON-RPC to ``…/jsonrpc/``) then fail, and a POST body
does not survive every redirect anyway. So the edge turns redirects off
(``create_app`` builds FastAPI with ``redirect_slashes=False``) and this outermost
wrapper drops one trailing slash before anything routes, so the guard, the error
boundary, the logs and the router all see the one form every route is registered
under. A path with more than one trailing slash is not an address the edge serves
(404, like any other unknown path).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


def without_trailing_slash(path: str) -> str:
    """``/a/b/`` -> ``/a/b``; ``/`` and ``/a/b`` unchanged; ``/a/b//`` -> ``/a/b/`` (still unknown)."""
    if len(path) > 1 and path.endswith("/"):
        return path[:-1]
    return path


class TrailingSlash:
    """ASGI wrapper: serves ``<route>/`` as ``<route>`` (HTTP only; the path and the raw path alike)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            stripped = without_trailing_slash(path)
            if stripped != path:
                scope = dict(scope, path=stripped)
                raw_path = scope.get("raw_path")
                if isinstance(raw_path, bytes) and raw_path.endswith(b"/"):
                    scope["raw_path"] = raw_path[:-1]
        await self.app(scope, receive, send)
