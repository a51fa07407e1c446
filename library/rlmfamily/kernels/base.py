"""The kernel seam: what a session may ask of an execution kernel, and the limits it runs under.

Owns ``KernelLimits`` (every bound a kernel enforces, named, with defaults, validated
on construction), ``StepResult`` (what one ``execute`` returns), the ``Kernel``
protocol that ``HostKernel`` and ``MontyKernel`` implement, the ``Bridge`` type
(host functions by name) and the kernel error classes. See docs/RLM_DESIGN.md.
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Final, Literal, Protocol, runtime_checkable

from rlmfamily.errors import KernelError

Bridge = Mapping[str, Callable[..., Any]]
"""Host functions by name. Arguments and results are JSON-like values."""

ErrorCode = Literal[
    "exception",
    "syntax",
    "timeout",
    "memory",
    "recursion",
    "suspensions",
    "host_call_timeout",
    "killed",
]

# Error codes after which the kernel rolled the namespace back (or restarted its process):
# the state the step may have damaged is gone, the state after the last good step is back.
ROLLBACK_CODES: Final = frozenset({"timeout", "memory", "suspensions", "killed"})


class KernelLimitsInvalid(KernelError):
    """A kernel limit is out of range; the message names the field to change."""

    code = "kernel_limits_invalid"


class KernelNotStarted(KernelError):
    """``execute`` was called before ``start`` or after ``close``."""

    code = "kernel_not_started"


class BridgeNameInvalid(KernelError):
    """A host function name cannot be bound in the sandbox (not an identifier, or reserved)."""

    code = "bridge_name_invalid"


@dataclass(frozen=True)
class KernelLimits:
    """Every bound a kernel enforces. ``RLMSettings`` builds one; defaults work on one machine.

    Which kernel enforces what (and how) is documented field by field; "both" means
    the host and the Monty kernel.
    """

    # both: seconds of execution per step, not counting time spent inside host calls
    # (Monty: the sandbox's feed clock; host: wall clock of the child minus host calls).
    step_timeout_s: float = 60.0
    # host: after SIGINT, seconds to wait for the step to stop before SIGKILL + restore.
    interrupt_grace_s: float = 2.0
    # both: printed output kept per step (the first bytes); the rest is counted and dropped.
    max_output_bytes: int = 65_536
    # both: error text (traceback) kept per step.
    max_error_bytes: int = 8_192
    # both: each host call's own deadline; an overrun raises TimeoutError in the sandboxed code.
    host_call_timeout_s: float = 300.0
    # both: host calls that overran their deadline and are still running in a thread. At this
    # many, further host calls are refused at once instead of piling up threads.
    max_abandoned_host_calls: int = 4
    # monty: heap bytes of the sandbox (Monty's max_memory).
    max_memory_bytes: int = 268_435_456
    # monty: call-stack depth (Monty's max_recursion_depth). The host kernel keeps Python's own
    # limit: the user's libraries need their usual stack.
    max_recursion_depth: int = 200
    # monty: suspensions per step (host calls, file reads, imports, name lookups, sleeps);
    # host: host calls per step. Exceeding it ends the step and rolls the state back.
    max_suspensions_per_step: int = 10_000
    # monty: Monty's own cumulative per-checkout cap (it cannot be disabled). The kernel
    # recycles the checkout (fresh worker, last dump loaded) before a step could reach it.
    max_suspensions_per_checkout: int = 100_000
    # monty: seconds of time.sleep() per step (sleep does not count as execution time).
    max_sleep_s_per_step: float = 10.0
    # host: address-space bytes of the child process (RLIMIT_AS); None = unlimited.
    host_max_address_space_bytes: int | None = 4_294_967_296
    # host: bytes of the pickled namespace kept as the restore point after each step.
    host_max_checkpoint_bytes: int = 268_435_456

    def __post_init__(self) -> None:
        def positive(name: str, value: float, *, upper: float = math.inf) -> None:
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not (0 < value <= upper) or math.isnan(value):
                raise KernelLimitsInvalid(
                    f"kernel limit {name} must be a number in (0, {upper:g}]; got {value!r}. Change {name}.",
                    setting=name,
                )

        def integer(name: str, value: int, *, lower: int, upper: int) -> None:
            if not isinstance(value, int) or isinstance(value, bool) or not (lower <= value <= upper):
                raise KernelLimitsInvalid(
                    f"kernel limit {name} must be an integer in [{lower}, {upper}]; got {value!r}. Change {name}.",
                    setting=name,
                )

        positive("step_timeout_s", self.step_timeout_s, upper=86_400)
        positive("interrupt_grace_s", self.interrupt_grace_s, upper=600)
        positive("host_call_timeout_s", self.host_call_timeout_s, upper=86_400)
        positive("max_sleep_s_per_step", self.max_sleep_s_per_step, upper=86_400)
        integer("max_output_bytes", self.max_output_bytes, lower=64, upper=1 << 30)
        integer("max_error_bytes", self.max_error_bytes, lower=64, upper=1 << 24)
        integer("max_abandoned_host_calls", self.max_abandoned_host_calls, lower=1, upper=1024)
        integer("max_memory_bytes", self.max_memory_bytes, lower=1 << 20, upper=1 << 40)
        integer("max_recursion_depth", self.max_recursion_depth, lower=10, upper=100_000)
        integer("max_suspensions_per_step", self.max_suspensions_per_step, lower=1, upper=10_000_000)
        integer("max_suspensions_per_checkout", self.max_suspensions_per_checkout, lower=2, upper=1 << 40)
        integer("host_max_checkpoint_bytes", self.host_max_checkpoint_bytes, lower=1024, upper=1 << 40)
        if self.host_max_address_space_bytes is not None:
            integer("host_max_address_space_bytes", self.host_max_address_space_bytes, lower=64 << 20, upper=1 << 50)
        # Each step also spends one suspension on re-binding the bridge; a checkout must hold
        # at least one full step or the kernel would recycle forever.
        if self.max_suspensions_per_checkout <= self.max_suspensions_per_step:
            raise KernelLimitsInvalid(
                "kernel limit max_suspensions_per_checkout must exceed max_suspensions_per_step "
                f"({self.max_suspensions_per_checkout} <= {self.max_suspensions_per_step}). "
                "Raise max_suspensions_per_checkout.",
                setting="max_suspensions_per_checkout",
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class StepResult:
    """What one ``execute`` did. A failed step never ends the session."""

    ok: bool  # the code ran to the end without an uncaught exception or a limit
    stdout: str  # printed output, the first ``max_output_bytes`` kept
    stdout_truncated: bool
    stdout_bytes: int  # total printed, including what was dropped
    error_code: ErrorCode | None
    error: str | None  # short, human-readable; a traceback for exceptions, bounded
    duration_s: float
    restored_from_checkpoint: bool  # the kernel rolled back / restarted after this step
    # Names the restore could not bring back (host kernel: unpicklable values); empty otherwise.
    lost_names: tuple[str, ...] = ()


@runtime_checkable
class Kernel(Protocol):
    """One persistent namespace per session; ``execute`` runs one step of model code in it."""

    name: str  # "host" | "monty"

    def start(self, bridge: Bridge, prelude: str) -> None: ...

    def execute(self, code: str) -> StepResult: ...

    def close(self) -> None: ...


def check_bridge_names(bridge: Bridge) -> None:
    """Refuse names the sandbox cannot bind, before any code runs."""
    for name in bridge:
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("__") or name in _PYTHON_KEYWORDS:
            raise BridgeNameInvalid(
                f"host function name {name!r} is not a bindable identifier (no keywords, no leading '__')"
            )
        if not callable(bridge[name]):
            raise BridgeNameInvalid(f"host function {name!r} is not callable")


def clip_text(text: str, max_bytes: int) -> str:
    """The first ``max_bytes`` of ``text`` (UTF-8), never splitting a character."""
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode("utf-8", "ignore") + "\n[... truncated]"


_PYTHON_KEYWORDS: Final = frozenset(keyword.kwlist + keyword.softkwlist)
