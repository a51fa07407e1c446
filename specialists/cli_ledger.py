"""`specialists credits|reservations|reconcile|ledger` subcommands (built with the ledger)."""

from __future__ import annotations

import argparse


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the ledger's subcommands to the `specialists` parser."""
