"""`specialists <command>` run in the test's own process, with exactly a given environment, its output captured.

A command run as a subprocess costs an interpreter's start-up and the imports of the command (about a second of
CPU on this machine, several at load 15-30) before it does anything the test looks at; tests that run dozens of
commands spent most of their time there (issue 40). The command is the same ``ops.cli.main`` the `specialists`
script calls, and reads its settings from the environment given, as a subprocess would. What only a process has
(a command that serves until stopped, its signals, its exit by a signal) stays a subprocess: ops/topology.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence

_ENVIRON = threading.Lock()  # one command at a time: each replaces the process's environment while it runs


def specialists(args: Sequence[str], env: Mapping[str, str], stdin: str | None = None) -> subprocess.CompletedProcess:
    """``specialists *args`` with ``env`` as its whole environment (and ``stdin`` as its input); its exit code,
    stdout and stderr."""
    from ops.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _ENVIRON:
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _stdin(stdin):
                try:
                    code = main(list(args))
                except SystemExit as exit_:  # argparse's --help and the like
                    code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        finally:
            os.environ.clear()
            os.environ.update(saved)
    return subprocess.CompletedProcess(["specialists", *args], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _stdin(text: str | None) -> Iterator[None]:
    saved = sys.stdin
    sys.stdin = io.StringIO(text or "")
    try:
        yield
    finally:
        sys.stdin = saved
