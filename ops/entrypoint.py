"""The image's entry point: `specialists <role> [args]`, with PORT honoured (the Dockerfile's ENTRYPOINT).

Cloud Run (like most container platforms) tells a container the port to listen on in PORT. The service
names its ports per role: SPECIALISTS_EDGE_PORT for `serve`, SPECIALISTS_WORKER_PORT for `worker`,
SPECIALISTS_CONSOLE_PORT for `console`. PORT becomes the port of the role this container runs, unless
that role's own setting is set. Only the role's own port: `serve`'s worker child keeps
SPECIALISTS_WORKER_PORT (and its console child SPECIALISTS_CONSOLE_PORT), so on one machine the edge
and its children never ask for the same port.

This is the one place that maps the platform's variable onto the settings, before they are read; the
image has no shell, so it is Python. The command then runs in this same process: it is the container's
main process and gets its SIGTERM directly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

ROLE_PORT_SETTINGS = {
    "serve": "SPECIALISTS_EDGE_PORT",
    "worker": "SPECIALISTS_WORKER_PORT",
    "console": "SPECIALISTS_CONSOLE_PORT",
}


def give_port_to_role(args: list[str], environ: MutableMapping[str, str]) -> None:
    """PORT becomes the port setting of the role named first in ``args``, unless that setting is set."""
    port = environ.get("PORT")
    setting = ROLE_PORT_SETTINGS.get(args[0]) if args else None
    if port and setting and not environ.get(setting):
        environ[setting] = port


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    give_port_to_role(args, os.environ)
    from ops.cli import main as specialists  # after: the settings are read when the command runs

    return specialists(args)


if __name__ == "__main__":
    sys.exit(main())
