"""The `specialists` command's global flags (``--json``, ``--operator``) and its parser's errors.

argparse copies a subcommand's defaults over what the level above it parsed, so a flag given before the
command was silently lost: ``specialists --json keys issue`` printed a table, and ``specialists --operator
alice credits adjust ...`` journalled the OS user. These flags set nothing on the namespace; each occurrence,
at any level, is collected in one ``GlobalFlags``, so they work before or after the command, and two different
operators are refused. The parser raises ``UsageError`` instead of printing and exiting, so that a script's
``--json`` gets its usage error as JSON too.
"""

from __future__ import annotations

import argparse


class GlobalFlags:
    """What ``--json`` and ``--operator`` said, wherever on the line they were given."""

    def __init__(self) -> None:
        self.json = False
        self.operators: list[str] = []

    def operator(self) -> str | None:
        named = list(dict.fromkeys(self.operators))
        if len(named) > 1:
            raise UsageError(f"--operator is given twice ({', '.join(named)}); give it once, before or after the command")
        return named[0] if named else None


class _FlagAction(argparse.Action):
    """A global flag: it writes to its ``GlobalFlags``, never to the namespace a subcommand may overwrite."""

    def __init__(self, option_strings: list[str], dest: str, *, flags: GlobalFlags, **kwargs: object) -> None:
        self.flags = flags
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, **kwargs)  # type: ignore[arg-type]


class JsonFlag(_FlagAction):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        self.flags.json = True


class OperatorFlag(_FlagAction):
    def __call__(self, parser, namespace, values, option_string=None) -> None:
        self.flags.operators.append(str(values))


class UsageError(Exception):
    """Bad arguments (exit 2): raised by the parser instead of printing and exiting, so that ``--json`` gets
    its error as JSON on stdout too."""

    def __init__(self, message: str, parser: argparse.ArgumentParser | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.parser = parser


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message, self)
