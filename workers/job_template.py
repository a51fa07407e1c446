"""What every job process of a worker needs and no job changes, built once in the forkserver (issue 44 §1).

Imported last by the job processes' forkserver (``workers.isolation.PRELOAD``). When the worker that starts
the forkserver offered its template (``offer``: the runners' recipe, pickled into a file only it can read, named
by ``TEMPLATE_VARIABLE``), the forkserver prepares the runners here, once: the specs, the model routes, the
runners, their engine (never connected: each job's process opens its own connections, and only when its run
needs one) and the digest of Monty's binary. Every job process is forked from this state, and reads nothing
of it again. Then ``gc.freeze()``: the collector of a job's process leaves what it inherited alone, so the pages
it shares with the forkserver are not copied by a collection.

A job process finds the template by its key (``prepared``). Another key, or none (a forkserver started before
this worker's offer, one restarted after its death, or a template that failed to build), and the job's process
prepares its runners itself, before its job comes, from the recipe it was given: slower, the same runners.
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import secrets
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

TEMPLATE_VARIABLE = "SPECIALISTS_JOB_TEMPLATE_FILE"  # set by the worker for the forkserver it starts; not a setting


@dataclass(frozen=True)
class Template:
    key: str
    recipe: Any
    prepared: Any  # what the build's prepare returned; None if it failed (the job's process tries again)


TEMPLATE: Template | None = None


def offer(key: str, offered: bytes) -> str:
    """Write ``offered`` (the pickled ``(key, build, recipe, log level)``) where the next forkserver this process
    starts reads it; the file's path, to ``withdraw`` once that forkserver has started."""
    descriptor, path = tempfile.mkstemp(prefix="specialists-job-template-")  # mode 0600: it holds the settings
    with os.fdopen(descriptor, "wb") as file:
        file.write(offered)
    os.environ[TEMPLATE_VARIABLE] = f"{os.getpid()}:{path}"
    return path


def withdraw(path: str) -> None:
    if os.environ.get(TEMPLATE_VARIABLE) == f"{os.getpid()}:{path}":
        del os.environ[TEMPLATE_VARIABLE]
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def prepared(key: str) -> Template | None:
    """The template of this key, in a job process forked from a forkserver that built it."""
    template = TEMPLATE
    if template is None or template.prepared is None or not secrets.compare_digest(template.key, key):
        return None
    return template


def _read(offered: str) -> Template | None:
    """The template offered (``offer``'s ``pid:path``), built; None if it is not this forkserver's, or failed."""
    offerer, _, path = offered.partition(":")
    if offerer != str(os.getppid()):  # not the forkserver of the worker that offered it
        return None
    try:
        with open(path, "rb") as file:
            key, build, recipe, log_level = pickle.load(file)
        logging.getLogger().setLevel(log_level)  # the worker's, once: a job's process that sets it again pays for it
        return Template(key, recipe, build.prepare(recipe))
    except Exception as exc:  # noqa: BLE001 - the forkserver must start anyway; each job's process prepares its own
        # To the worker's stderr (the forkserver inherits it): a job whose own preparation fails too says why.
        logging.getLogger(__name__).warning(
            "the job processes' runners could not be prepared in the forkserver (%s): each job's process prepares "
            "its own, before its job comes", type(exc).__name__)
        return None


def _build() -> None:
    """In the forkserver, at its preload: the offered template, if any, then the collector's freeze (with or
    without a template: a job's collector then leaves the imported modules' pages shared too)."""
    global TEMPLATE
    offered = os.environ.pop(TEMPLATE_VARIABLE, None)
    if sys.argv[:1] != ["-c"]:  # not a forkserver (it runs as `python -c ...`)
        return
    if offered is not None:
        TEMPLATE = _read(offered)
    gc.collect()
    gc.freeze()


_build()
