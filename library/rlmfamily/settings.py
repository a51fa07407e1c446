"""Every named limit of the RLM library, in one settings object, validated at start-up.

Read from the environment with the prefix ``RLM_`` (``RLM_MAX_TURNS=20``) or passed
as keyword arguments. Nothing else in ``rlmfamily/`` reads ``os.environ`` for
configuration (the provider reads the API key from the variable *named* here;
rlmfamily/data_location.py reads the platform's XDG_DATA_HOME / LOCALAPPDATA).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from rlmfamily.data_location import DataLocation, locate
from rlmfamily.errors import SettingsInvalid
from rlmfamily.gates.spec import GateSpec, check_gates

KernelName = Literal["host", "monty", "container"]
ContainerEngineName = Literal["auto", "podman", "docker"]  # rlmfamily/container/engine.py
# The image `rlm container image` builds from this machine's packages (rlmfamily/container/image.py).
DEFAULT_CONTAINER_IMAGE = "localhost/rlmfamily-python:local"
ProviderName = Literal["openai", "anthropic", "gemini"]
ProtocolName = Literal["tools", "text", "auto"]  # how code reaches the kernel: rlmfamily/protocol.py
ProfileName = Literal["python", "python-bash"]  # python-bash adds command jobs: rlmfamily/bash/
ObservationStrategy = Literal["transcript", "receipts"]  # what a step's output shows the model
# Variables a command may inherit (RLM_BASH_ENV_ALLOW). Nothing that looks like a credential is ever allowed.
DEFAULT_BASH_ENV_ALLOW = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "USER", "LOGNAME", "TMPDIR")
CREDENTIAL_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "SESSION")
# Each provider's defaults when RLM_BASE_URL / RLM_API_KEY_ENV are not set. None: the client's own default.
DEFAULT_BASE_URL: dict[str, str | None] = {"openai": "https://api.openai.com/v1", "anthropic": None, "gemini": None}
DEFAULT_API_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}
ANTHROPIC_MAX_TEMPERATURE = 1.0  # the Messages API refuses more; OpenAI accepts up to 2
# The final-answer reserve when final_reserve_tokens is not set: this share of max_tokens, at most this many.
FINAL_RESERVE_SHARE = 10
FINAL_RESERVE_MAX_TOKENS = 50_000


class RLMSettings(BaseSettings):
    """Named limits and defaults. Each one is documented in docs/RLM.md."""

    model_config = SettingsConfigDict(env_prefix="RLM_", extra="forbid", validate_default=True)

    # Where runs, trajectories, history and the budget ledger live. Not set: chosen when the settings are
    # built, a project's .rlm/ folder, else the platform's data folder (rlmfamily/data_location.py).
    data_dir: Path | None = None
    _data_location: DataLocation | None = PrivateAttr(None)

    # The root session.
    kernel: KernelName = "monty"
    max_turns: int = Field(12, ge=1, le=200)
    max_run_s: float = Field(1800.0, gt=0)
    max_observation_chars: int = Field(4000, ge=200, le=200_000)
    observation_tail_chars: int = Field(1000, ge=0)
    max_answer_chars: int = Field(20_000, ge=100)
    root_timeout_s: float = Field(300.0, gt=0)  # one root-model call, retries included
    # "python" (the default: the python tool only) or "python-bash" (rlmfamily/bash: bash.run and the bash tool).
    profile: ProfileName = "python"
    # "transcript" (the default): a step's output, head and tail; "receipts" (an experiment): a compact receipt
    # with a preview of receipt_preview_chars and the history id holding the whole output.
    observation_strategy: ObservationStrategy = "transcript"
    receipt_preview_chars: int = Field(600, ge=50, le=100_000)
    # A follow-up question (rlm ask, Session.follow_up) to a root whose conversation is longer than this many
    # characters gets a summary of it, at most follow_up_summary_chars, with handles to the full record instead.
    follow_up_compact_chars: int = Field(200_000, ge=1_000, le=100_000_000)
    follow_up_summary_chars: int = Field(8_000, ge=1_000, le=1_000_000)

    # Kernels: the same names as rlmfamily.kernels.base.KernelLimits (see kernel_limits()).
    # Both kernels: seconds of execution per step, printed output and error text kept per step,
    # each host call's own deadline, overrun host calls tolerated before refusing more.
    step_timeout_s: float = Field(60.0, gt=0, le=86_400)
    max_output_bytes: int = Field(65_536, ge=1024, le=1 << 30)
    max_error_bytes: int = Field(8_192, ge=64, le=1 << 24)
    host_call_timeout_s: float = Field(300.0, gt=0, le=86_400)
    max_abandoned_host_calls: int = Field(4, ge=1, le=1024)
    # Monty only: heap, stack depth, suspensions (host calls, lookups) per step and per checkout, sleep.
    max_memory_bytes: int = Field(268_435_456, ge=1 << 20)
    max_recursion_depth: int = Field(200, ge=10, le=100_000)
    max_suspensions_per_step: int = Field(10_000, ge=1)
    max_suspensions_per_checkout: int = Field(100_000, ge=2)
    max_sleep_s_per_step: float = Field(10.0, gt=0)
    # Host kernel only: grace after SIGINT before SIGKILL, address space, size of the restore point.
    interrupt_grace_s: float = Field(2.0, gt=0, le=600)
    host_max_address_space_bytes: int | None = Field(4_294_967_296, ge=64 << 20)
    host_max_checkpoint_bytes: int = Field(268_435_456, ge=1024)

    # The corpus.
    max_files: int = Field(20_000, ge=1)
    max_bundle_items: int = Field(20_000, ge=1, le=10_000_000)  # evidence items of one bundle
    max_file_bytes: int = Field(2_000_000, ge=1)
    max_total_bytes: int = Field(64_000_000, ge=1)
    max_read_chars: int = Field(200_000, ge=100)
    max_search_hits: int = Field(200, ge=1)
    # A search pattern: its length, its RE2 program (instructions: the NFA's worst case is linear in
    # text x program), the engine's memory for it, and the search's own deadline, checked between matches
    # (the smaller of it and host_call_timeout_s: a search never outlives its host call by more than one match).
    max_search_pattern_chars: int = Field(1000, ge=10, le=100_000)
    max_search_program_size: int = Field(2500, ge=100, le=1_000_000)
    max_search_pattern_memory_bytes: int = Field(8 << 20, ge=1 << 20, le=1 << 30)
    search_timeout_s: float = Field(30.0, gt=0, le=86_400)
    search_snippet_chars: int = Field(240, ge=20)
    # A search hit passed as a sub-call's context: its lines plus this many either side, within hit_context_chars.
    hit_context_lines: int = Field(3, ge=0, le=1000)
    hit_context_chars: int = Field(4000, ge=100, le=1_000_000)
    max_chunks: int = Field(5000, ge=1)
    max_select_globs: int = Field(64, ge=1, le=10_000)  # globs of one view, nested selects counted together
    max_glob_chars: int = Field(500, ge=10, le=100_000)  # one glob
    max_context_text_chars: int = Field(20_000, ge=100)

    # Sub-calls (llm_query, llm_query_batched).
    max_subcalls: int = Field(200, ge=0)
    max_batch_size: int = Field(32, ge=1)
    max_concurrency: int = Field(4, ge=1, le=64)
    max_prompt_chars: int = Field(120_000, ge=100)
    max_response_chars: int = Field(20_000, ge=100)
    subcall_timeout_s: float = Field(120.0, gt=0)
    # An identical sub-call of the same family is answered from memo.sqlite3 (rlmfamily/memo.py), which keeps
    # at most this many answers per family (each at most max_response_chars), the least recently used going first.
    memoise_subcalls: bool = True
    max_memoised_subcalls: int = Field(1000, ge=1, le=1_000_000)

    # One inference allowance per root family. None = no limit on that axis.
    max_calls: int | None = Field(300, ge=1)
    max_tokens: int | None = Field(3_000_000, ge=1)
    # Tokens of max_tokens that every other call leaves for the run's final-answer request (rlmfamily/budget.py).
    # Not set: scaled to the budget, max_tokens // FINAL_RESERVE_SHARE, at most FINAL_RESERVE_MAX_TOKENS, so a
    # small --max-tokens (a local model's budget) works as given. Set (--final-reserve-tokens): under max_tokens.
    final_reserve_tokens: int = Field(FINAL_RESERVE_MAX_TOKENS, ge=0)
    max_usd: float | None = Field(None, gt=0)

    # The model endpoint: "openai" (any OpenAI-compatible API), "anthropic" (the Messages API, extra
    # rlmfamily[anthropic]) or "gemini" (Google's generateContent, extra rlmfamily[gemini]). base_url and api_key_env default per provider (DEFAULT_BASE_URL, DEFAULT_API_KEY_ENV).
    provider: ProviderName = "openai"
    # How the model sends code: "tools" (the python tool), "text" (fenced ```python blocks, for servers without
    # tool calling), "auto" (tools, then text if the first call is refused for its tools).
    protocol: ProtocolName = "tools"
    base_url: str | None = None
    model: str | None = None
    subcall_model: str | None = None
    api_key_env: str | None = None
    # Sampling, sent with every call when set; None = the endpoint's default (Anthropic needs a
    # max_tokens: ANTHROPIC_DEFAULT_MAX_TOKENS in rlmfamily/providers/anthropic_native.py).
    temperature: float | None = Field(None, ge=0, le=2)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    provider_max_retries: int = Field(3, ge=0, le=10)
    provider_backoff_s: float = Field(0.5, ge=0, le=60)
    # USD per million tokens, by model id: {"gpt-4o-mini": {"prompt": 0.15, "completion": 0.6}}.
    prices_usd_per_mtok: dict[str, dict[str, float]] = Field(default_factory=dict)
    price_table_file: Path | None = None

    # History.
    max_history_read_chars: int = Field(20_000, ge=100)
    max_history_hits: int = Field(50, ge=1)
    max_history_query_words: int = Field(16, ge=1, le=1000)  # words of one history.search, each a scan of every entry

    # `rlm show --html`: characters of one text (an output, a prompt, an answer) on the page; longer ones are clipped.
    html_max_text_chars: int = Field(20_000, ge=200, le=10_000_000)

    # Families (rlmfamily/family): children run as separate processes and share the root's allowance.
    max_child_depth: int = Field(1, ge=0, le=8)  # 1: a root may start children, children may not
    max_children: int = Field(8, ge=0, le=1000)  # child agents in one family, root excluded
    max_parallel_children: int = Field(4, ge=1, le=64)  # child runs active at once in one family
    child_start_timeout_s: float = Field(30.0, gt=0, le=600)  # a child process must confirm its start by then
    child_cancel_grace_s: float = Field(2.0, gt=0, le=600)  # after SIGTERM, before SIGKILL of its process tree
    max_message_chars: int = Field(20_000, ge=100, le=10_000_000)  # one family message
    max_inbox_read: int = Field(50, ge=1, le=1000)  # messages one rlm.inbox() returns
    max_family_messages: int = Field(10_000, ge=1)  # messages kept for one family

    # A2A delegation (rlmfamily/a2a): off by default; a key in the environment never enables a route.
    a2a_enabled: bool = False  # routing on: delegate to the peers in a2a_peers_file
    a2a_paid_enabled: bool = False  # paid peers on (also needs a positive a2a_credit_allowance)
    a2a_peers_file: Path | None = None  # TOML or JSON, see docs/RLM.md
    a2a_credit_allowance: int = Field(0, ge=0)  # credits the whole root family may draw; stored once, never refilled
    a2a_max_delegations: int = Field(32, ge=1, le=10_000)  # delegations per root family, all peers
    a2a_connect_timeout_s: float = Field(10.0, gt=0, le=600)
    a2a_request_timeout_s: float = Field(60.0, gt=0, le=3600)  # one HTTP exchange with a peer
    a2a_max_card_bytes: int = Field(262_144, ge=1024, le=16 << 20)  # an Agent Card, counted while reading
    a2a_max_wait_s: float = Field(120.0, gt=0, le=86_400)  # one handle.wait(); longer waits are cut to this
    a2a_poll_interval_s: float = Field(1.0, gt=0, le=60)  # between GetTask calls in wait()
    a2a_max_read_chars: int = Field(20_000, ge=100)  # one handle.read()
    a2a_summary_chars: int = Field(1_000, ge=100, le=100_000)  # previews in status() and summary()

    # The python-bash profile (rlmfamily/bash): command jobs in the workspace, one process group each.
    bash_path: Path | None = None  # None: `bash` found on the allowed PATH, checked to be Bash
    bash_workspace: Path | None = None  # None: the run's repository
    bash_tool: bool = True  # offer the model a `bash` tool beside `python` (bash.run works either way)
    bash_env_allow: list[str] = Field(default_factory=lambda: list(DEFAULT_BASH_ENV_ALLOW))
    bash_preview_bytes: int = Field(2000, ge=100, le=1_000_000)  # of each stream in a receipt: head and tail
    bash_max_stored_bytes: int = Field(16 << 20, ge=1024, le=1 << 34)  # of each stream kept in its file
    bash_default_deadline_s: float = Field(60.0, gt=0, le=86_400)
    bash_max_deadline_s: float = Field(240.0, gt=0, le=86_400)
    bash_kill_grace_s: float = Field(2.0, gt=0, le=600)  # after SIGTERM of a job's process group, before SIGKILL
    # Container kernel: the host stops a job's engine client this long after its deadline and grace, if the job
    # runner inside has not ended it by then (a stalled engine or container).
    bash_container_margin_s: float = Field(10.0, gt=0, le=600)
    bash_lease_wait_s: float = Field(30.0, ge=0, le=86_400)  # waiting for the workspace lease or a read-only slot
    bash_max_read_only_jobs: int = Field(4, ge=1, le=256)  # read-only jobs running at once in one family
    bash_max_read_bytes: int = Field(20_000, ge=100, le=1 << 24)  # of one bash.read
    bash_max_command_chars: int = Field(20_000, ge=10, le=1_000_000)
    bash_max_jobs: int = Field(1000, ge=1, le=1_000_000)  # jobs per family

    # The container kernel (RLM_KERNEL=container, rlmfamily/container): one container per run, root or child.
    container_engine: ContainerEngineName = "auto"  # auto: the first engine that answers and holds the image
    container_image: str = Field(DEFAULT_CONTAINER_IMAGE, min_length=1, max_length=512)  # never pulled
    container_network: str = Field("none", min_length=1, max_length=128)  # "none": no network at all
    container_memory_bytes: int = Field(2 << 30, ge=16 << 20, le=1 << 44)  # memory and swap together
    container_cpus: float = Field(1.0, gt=0, le=1024)  # at most the machine's CPUs
    container_max_pids: int = Field(512, ge=16, le=1 << 22)  # processes and threads at once (a fork bomb's bound)
    container_max_open_files: int = Field(1024, ge=64, le=1 << 20)  # per process; at most the host's hard limit
    # RLIMIT_NPROC inside (a non-root user's processes, counted machine-wide by the kernel; root ignores it). Set
    # because the engines' default can exceed what this machine lets them set; container_max_pids is the real bound.
    container_max_user_processes: int = Field(16_384, ge=64, le=1 << 22)
    container_start_timeout_s: float = Field(60.0, gt=0, le=3600)  # until its main process says ready
    container_stop_timeout_s: float = Field(10.0, gt=0, le=600)  # until it is gone, after its run ends

    # Completion gates (rlmfamily/gates): commands run in the workspace when the model answers; the run is accepted
    # only when every one passes. RLM_GATES is a JSON list of {"name", "command", "deadline_s"} (rlm run --gate).
    gate_default_deadline_s: float = Field(300.0, gt=0, le=86_400)  # of a gate that names none
    gate_max_deadline_s: float = Field(1800.0, gt=0, le=86_400)  # the longest a gate may ask for
    max_gates: int = Field(8, ge=1, le=64)
    gate_excerpt_bytes: int = Field(4000, ge=200, le=1_000_000)  # of a failed gate's output shown: head and tail
    gates: list[GateSpec] = Field(default_factory=list)  # after the limits above: its check reads them

    @field_validator("data_dir", "price_table_file", "a2a_peers_file", "bash_path", "bash_workspace")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @model_validator(mode="after")
    def _locate_data(self) -> RLMSettings:
        # Once, here: every path below and every child process (given --data-dir) then uses the same folder.
        self._data_location = locate(self.data_dir)
        self.data_dir = self._data_location.path
        return self

    @field_validator("container_image", "container_network")
    @classmethod
    def _container_name(cls, value: str) -> str:
        # Passed to the engine's CLI as one argument: nothing that could read as an option or split a word.
        if value.startswith("-") or any(c.isspace() or c == "," for c in value):
            raise ValueError(f"{value!r} is not an image or network name (no leading '-', spaces or commas)")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        # A common mistake is to paste the key itself here: refuse anything not shaped like a name.
        if value is None:
            return None
        if not value or not value.replace("_", "").isalnum() or value[0].isdigit():
            raise ValueError("must be the NAME of an environment variable (e.g. OPENAI_API_KEY), not the key")
        return value

    @field_validator("prices_usd_per_mtok")
    @classmethod
    def _prices(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for model, price in value.items():
            if (not {"prompt", "completion"} <= set(price) <= {"prompt", "completion", "cached", "cache_write"}
                    or min(price.values()) < 0):
                raise ValueError(f"price for {model!r} needs non-negative 'prompt' and 'completion' USD per million "
                                 "tokens (and may have 'cached' and 'cache_write')")
        return value

    @field_validator("gates")
    @classmethod
    def _gates(cls, value: list[GateSpec], info: ValidationInfo) -> list[GateSpec]:
        limits = info.data  # the fields declared before this one; one that failed its own check is absent
        if {"max_gates", "gate_max_deadline_s", "bash_max_command_chars"} <= set(limits):
            check_gates(value, max_gates=limits["max_gates"], max_deadline_s=limits["gate_max_deadline_s"],
                        max_command_chars=limits["bash_max_command_chars"])
        return value

    @field_validator("bash_env_allow")
    @classmethod
    def _allowed_env(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name or not name.replace("_", "").isalnum() or name[0].isdigit():
                raise ValueError(f"{name!r} is not an environment variable name")
            if any(word in name.upper() for word in CREDENTIAL_WORDS):
                raise ValueError(f"{name} looks like a credential; a command never inherits one")
        return value

    @model_validator(mode="after")
    def _coherent(self) -> RLMSettings:
        if self.observation_tail_chars >= self.max_observation_chars // 2:
            raise ValueError("observation_tail_chars must be under half of max_observation_chars")
        if self.host_call_timeout_s < self.subcall_timeout_s:
            raise ValueError("host_call_timeout_s must be at least subcall_timeout_s, or every sub-call could be cut off")
        if self.max_concurrency > self.max_batch_size:
            raise ValueError("max_concurrency cannot exceed max_batch_size")
        if self.max_suspensions_per_checkout <= self.max_suspensions_per_step:
            raise ValueError("max_suspensions_per_checkout must exceed max_suspensions_per_step")
        if self.max_file_bytes > self.max_total_bytes:
            raise ValueError("max_file_bytes cannot exceed max_total_bytes")
        if self.max_tokens is not None and "final_reserve_tokens" not in self.model_fields_set:
            # Scaled, not set: kept out of pydantic's fields_set, so settings rebuilt from those given scale it again.
            self.__dict__["final_reserve_tokens"] = min(FINAL_RESERVE_MAX_TOKENS, self.max_tokens // FINAL_RESERVE_SHARE)
        if self.max_tokens is not None and self.final_reserve_tokens >= self.max_tokens:
            raise ValueError(f"final_reserve_tokens ({self.final_reserve_tokens:,}, --final-reserve-tokens or "
                             f"RLM_FINAL_RESERVE_TOKENS) must be under max_tokens ({self.max_tokens:,}, --max-tokens or "
                             "RLM_MAX_TOKENS), or no call but the final answer could ever be admitted; left unset, it "
                             f"is 1/{FINAL_RESERVE_SHARE} of max_tokens, at most {FINAL_RESERVE_MAX_TOKENS:,}")
        if self.provider == "anthropic" and self.temperature is not None and self.temperature > ANTHROPIC_MAX_TEMPERATURE:
            raise ValueError(f"temperature must be at most {ANTHROPIC_MAX_TEMPERATURE:g} for provider anthropic")
        if self.a2a_paid_enabled and not self.a2a_enabled:
            raise ValueError("a2a_paid_enabled needs a2a_enabled (routing on) as well")
        if self.a2a_enabled and self.a2a_max_wait_s + self.a2a_request_timeout_s > self.host_call_timeout_s:
            raise ValueError("a2a_max_wait_s + a2a_request_timeout_s must fit in host_call_timeout_s, or a wait() "
                             "would be cut off by the host call's deadline")
        if self.gate_default_deadline_s > self.gate_max_deadline_s:
            raise ValueError("gate_default_deadline_s cannot exceed gate_max_deadline_s")
        if self.bash_default_deadline_s > self.bash_max_deadline_s:
            raise ValueError("bash_default_deadline_s cannot exceed bash_max_deadline_s")
        if self.profile == "python-bash" and (
                self.bash_max_deadline_s + self.bash_kill_grace_s + self.bash_lease_wait_s > self.host_call_timeout_s):
            raise ValueError("bash_max_deadline_s + bash_kill_grace_s + bash_lease_wait_s must fit in "
                             "host_call_timeout_s, or a bash.run would be cut off by the host call's deadline")
        if self.profile == "python-bash" and self.kernel == "container" and (
                self.bash_max_deadline_s + self.bash_kill_grace_s + self.bash_lease_wait_s
                + self.bash_container_margin_s > self.host_call_timeout_s):
            raise ValueError("with the container kernel, bash_max_deadline_s + bash_kill_grace_s + bash_lease_wait_s "
                             "+ bash_container_margin_s must fit in host_call_timeout_s, or a bash.run would be cut "
                             "off by the host call's deadline")
        if self.profile == "python-bash" and self.key_env in self.bash_env_allow:
            raise ValueError(f"bash_env_allow names {self.key_env}, the model key's variable")
        return self

    def kernel_limits(self) -> Any:
        """The ``KernelLimits`` both kernels enforce, built from the fields of the same names."""
        from rlmfamily.kernels.base import KernelLimits  # the kernels package is optional at import time

        names = KernelLimits.field_names()
        return KernelLimits(**{name: getattr(self, name) for name in names if name in type(self).model_fields})

    @property
    def key_env(self) -> str:
        """The NAME of the variable holding the model key: RLM_API_KEY_ENV, else the provider's default."""
        return self.api_key_env or DEFAULT_API_KEY_ENV[self.provider]

    @property
    def endpoint(self) -> str | None:
        """The model endpoint: RLM_BASE_URL, else the provider's default (None: the client's own)."""
        return self.base_url or DEFAULT_BASE_URL[self.provider]

    @property
    def data_location(self) -> DataLocation:
        """The data folder, the rule that chose it and why (``rlm where``; the legacy folder's notice)."""
        return self._data_location or locate(self.data_dir)

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    @property
    def budget_path(self) -> Path:
        return self.data_dir / "budget.sqlite3"

    @property
    def history_path(self) -> Path:
        return self.data_dir / "history.sqlite3"

    @property
    def family_path(self) -> Path:
        return self.data_dir / "family.sqlite3"

    @property
    def memo_path(self) -> Path:
        return self.data_dir / "memo.sqlite3"

    @property
    def a2a_path(self) -> Path:
        return self.data_dir / "a2a.sqlite3"

    @property
    def jobs_path(self) -> Path:
        return self.data_dir / "jobs.sqlite3"


def env_name(field: str) -> str:
    """The environment variable that sets ``field`` (for error messages)."""
    return "RLM_" + field.upper()


def load_settings(**overrides: Any) -> RLMSettings:
    """Build settings from the environment plus overrides; invalid values raise SettingsInvalid naming the setting."""
    try:
        return RLMSettings(**overrides)
    except SettingsError as exc:  # a variable of a list or dict setting (RLM_GATES, ...) that is not JSON
        field = next((name for name in RLMSettings.model_fields if f'field "{name}"' in str(exc)), None)
        label = f"{env_name(field)} must be JSON" if field else str(exc)
        raise SettingsInvalid(f"invalid RLM settings: {label} ({exc.__cause__ or exc})", setting=field) from None
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            label = f"{field} ({env_name(field)})" if err["loc"] else "settings"
            problems.append(f"{label}: {err['msg']}")
        first = str(exc.errors()[0]["loc"][0]) if exc.errors() and exc.errors()[0]["loc"] else None
        raise SettingsInvalid("invalid RLM settings: " + "; ".join(problems), setting=first) from None
