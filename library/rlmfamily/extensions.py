"""The seam through which families (``rlm.run``, the inbox) and delegations (``a2a``) join a session.

An extension is built once per run from a ``RunInfo`` and then:

- adds host functions (names start with ``_``) and prelude source to the namespace,
  and a paragraph to the system prompt (``notes``);
- takes part in the run's end: ``finish()`` is called after the last turn, whatever
  the stop reason, and blocks while work the run must wait for is still going
  (active children, required remote tasks), at most until ``RunInfo.deadline``.
  In a run with completion gates it is also called each time the model answers,
  before the gates run, so it may be called more than once;
- may say what keeps the run from being accepted once ``finish`` returned (an
  optional ``blockers()`` method: a list of sentences, e.g. a required delegation
  left ``unknown``, a child still active). Any blocker makes the run's verdict
  ``not_verified`` (rlmfamily/gates/verdict.py);
- adds fields to the final record (``record()``: the ``run_finished`` event and
  ``RunResult.extra``);
- may offer the model tools beside ``python`` (an optional ``model_tools``
  attribute: name -> an object with ``schema``, the function tool sent with
  each root call, and ``run(call, turn)``, which returns ``ok``, the ``full``
  output, its ``receipt`` and fields for the trajectory); the session runs a
  call of one as a ``tool_step`` (the python-bash profile's ``bash`` tool);
- ``close()`` releases what it holds; it is called even when the run failed.

Extensions are independent of each other; the session calls them in list order.
This module is the seam only: it knows no implementation. Which extensions a run
gets unless its caller names them is decided in rlmfamily/composition.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rlmfamily.budget import Budget
    from rlmfamily.context import Context
    from rlmfamily.history import History
    from rlmfamily.providers.base import Provider
    from rlmfamily.settings import RLMSettings
    from rlmfamily.trajectory import TrajectoryWriter


@dataclass(frozen=True)
class RunInfo:
    """What an extension may know about the run it joins."""

    run_id: str  # this run (trajectory, checkpoints)
    root_id: str  # the family's root run: the budget's key
    agent_id: str  # who this session is in its family (the root's agent id is its run id)
    settings: RLMSettings
    context: Context
    provider: Provider
    kernel: str  # "host" | "monty" | "container"
    model: str | None
    budget: Budget
    history: History
    trajectory: TrajectoryWriter
    deadline: float  # time.monotonic() by which the run must end (max_run_s)
    emit: Callable[[dict[str, Any]], None]  # progress events (the CLI's live line)
    current_turn: Callable[[], int]
    environment: Environment | None = None  # where the run's code and commands execute; None: this machine


class Environment(Protocol):
    """Where a run executes when not on this machine: its container (rlmfamily/container/sandbox.py, RunContainer).

    It lives from before the extensions are built until after they close. Commands run in it through
    ``exec_argv`` (the host command that runs ``argv`` inside, in ``workdir``, with ``env`` and nothing of the
    host's environment); ``workspace`` is the host folder mounted at ``workdir``'s default.
    """

    name: str
    workspace: Path
    client_dir: Path  # the working directory to start ``exec_argv``'s command in (the engine may write there)

    def exec_argv(self, argv: Sequence[str], *, workdir: str = ..., env: Mapping[str, str] | None = None,
                  interactive: bool = True) -> list[str]: ...

    def signal(self, pid: int, sig: int, *, group: bool = False) -> bool: ...

    def close(self) -> None: ...


class Extension(Protocol):
    prelude: str  # sandbox-side source, run after the core prelude before every step
    notes: str  # appended to the system prompt ("" for none)

    def functions(self) -> dict[str, Callable[..., Any]]: ...

    def finish(self) -> None: ...

    def record(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


ExtensionFactory = Callable[[RunInfo], Extension]
