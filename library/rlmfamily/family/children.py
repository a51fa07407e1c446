"""Children of a family: admission, their processes, handles (status, wait, cancel), follow-ups, recovery.

Each child run is its own OS process (``python -m rlmfamily.family.child_process``) running
its own session loop with its own kernel and history, drawing on the root's one
durable budget. Processes make the things that matter real: children progress
in parallel on several cores, ``cancel`` stops a whole process tree, and a child
outlives a crash of its parent.

Admission checks depth (``max_child_depth``), the number of child agents in the
family (``max_children``), the child runs active at once
(``max_parallel_children``) and the budget, in one ``BEGIN IMMEDIATE``
transaction of the family store, and raises at once with the setting's name.

Liveness: a run started by this process is watched through its ``Popen``; any
other (after a restart, or a grandchild) only counts as alive when its identity
is proven (pid alive, same start time, the run's token on its command line), or
when it has no pid yet and the process that admitted it (which spawns it next)
is alive.
A run whose process is gone without a result becomes ``interrupted``; nothing
is ever assumed alive from a pid alone.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlmfamily.budget import BudgetLedger
from rlmfamily.errors import BudgetExhausted, BudgetUnknownUsage, UsageEntryNotFound
from rlmfamily.family import procs
from rlmfamily.family.errors import (
    FamilyArgumentInvalid,
    AgentNotFound,
    ChildDepthExceeded,
    ChildLimitReached,
    ChildNotCompleted,
    ChildNotFound,
    ChildPromptTooLarge,
    ChildrenUnavailable,
    FamilyNotFound,
    ParallelChildLimitReached,
)
from rlmfamily.family.store import Agent, FamilyStore, RunRecord
from rlmfamily.settings import RLMSettings

CONVERSATION_FILE = "conversation.json"
RUNNER_LOG = "runner.log"
CHILD_MIN_CALLS = 2  # a child needs one turn and the call it keeps back for its final answer
POLL_S = 0.05
LOG_TAIL_BYTES = 1500
SUMMARY_PROMPT_CHARS = 200  # of a child's prompt in its summary (status, the final record)

# Processes this Python process started, by run id: reaped here, watched without /proc guesses.
_PROCS: dict[str, subprocess.Popen[bytes]] = {}
_PROCS_LOCK = threading.Lock()


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


class Family:
    """The children of one root run (``root_id``), seen from this process."""

    def __init__(self, settings: RLMSettings, root_id: str, *, store: FamilyStore | None = None) -> None:
        self.settings = settings
        self.root_id = root_id
        self.store = store or FamilyStore(settings.family_path)

    @classmethod
    def open(cls, settings: RLMSettings, root_id: str) -> Family:
        """An existing family (e.g. after a restart); ``recover()`` then settles what its children became."""
        store = FamilyStore(settings.family_path)
        if not store.family_exists(root_id):
            raise FamilyNotFound(f"no family for run {root_id!r} in {settings.family_path} "
                                 "(data dir: RLM_DATA_DIR / --data-dir)")
        return cls(settings, root_id, store=store)

    # ---------- admission ----------

    def start(self, parent_id: str, prompt: str, *, filters: list[list[str]] | None = None,
              spec_source: Callable[[], dict[str, Any]] | None = None) -> RunRecord:
        """Admit a child of ``parent_id`` and start its process; raises at once when a limit refuses."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise FamilyArgumentInvalid("rlm.run needs a prompt: rlm.run('what the child should find out')")
        self._check_prompt(prompt)
        self._ensure_spec(spec_source)
        self._refresh_active()
        self._check_budget()
        token = secrets.token_hex(16)
        settings = self.settings
        with self.store.transaction() as conn:
            parent = self._agent_in(conn, parent_id)
            depth = parent.depth + 1
            if depth > settings.max_child_depth:
                raise ChildDepthExceeded(
                    f"{parent_id} is at depth {parent.depth}; a child would be at depth {depth} and "
                    f"max_child_depth is {settings.max_child_depth} (RLM_MAX_CHILD_DEPTH). Do this work here, "
                    "or ask your parent to start it",
                    setting="max_child_depth",
                )
            children = conn.execute("SELECT COUNT(*) FROM agents WHERE root_id = ? AND depth > 0",
                                    (self.root_id,)).fetchone()[0]
            if children >= settings.max_children:
                raise ChildLimitReached(
                    f"this family already has {children} children; max_children is {settings.max_children} "
                    "(RLM_MAX_CHILDREN). Reuse a finished child with rlm.follow_up(child, prompt)",
                    setting="max_children",
                )
            self._check_parallel(conn)
            siblings = conn.execute("SELECT COUNT(*) FROM agents WHERE parent_id = ?", (parent_id,)).fetchone()[0]
            agent = Agent(f"{parent_id}.c{siblings + 1}", self.root_id, parent_id, depth,
                          list(parent.filters) + [list(g) for g in (filters or [])])
            FamilyStore.insert_agent(conn, agent)
            FamilyStore.insert_run(conn, run_id=agent.agent_id, agent_id=agent.agent_id, root_id=self.root_id,
                                   kind="run", follows=None, prompt=prompt, token=token)
        return self._spawn(agent.agent_id, token)

    def follow_up(self, caller_id: str | None, child: str, prompt: str) -> RunRecord:
        """New work for a completed child, continuing its conversation; its earlier records stay as they are."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise FamilyArgumentInvalid("rlm.follow_up needs a prompt: rlm.follow_up(child, 'what to do next')")
        self._check_prompt(prompt)
        agent = self._child_agent(caller_id, child)
        runs = self.store.runs(self.root_id, agent_id=agent.agent_id)
        latest = self._refresh(runs[-1])
        if latest.active:
            raise ChildNotCompleted(f"child {agent.agent_id} is still working (run {latest.run_id}); "
                                    "wait for it, then follow up")
        if latest.state != "completed" or not (self._run_dir(latest.run_id) / CONVERSATION_FILE).is_file():
            raise ChildNotCompleted(
                f"child {agent.agent_id}'s last run {latest.run_id} ended {latest.state}; a follow-up continues "
                "a completed child's conversation. Start a new child with rlm.run(prompt)"
            )
        self._refresh_active()
        self._check_budget()
        token = secrets.token_hex(16)
        with self.store.transaction() as conn:
            busy = conn.execute("SELECT run_id FROM runs WHERE agent_id = ? AND state IN ('admitted', 'running')",
                                (agent.agent_id,)).fetchone()
            if busy is not None:
                raise ChildNotCompleted(f"child {agent.agent_id} is already working on {busy['run_id']}; "
                                        "wait for it, then follow up")
            self._check_parallel(conn)
            done = conn.execute("SELECT COUNT(*) FROM runs WHERE agent_id = ? AND kind = 'follow_up'",
                                (agent.agent_id,)).fetchone()[0]
            run_id = f"{agent.agent_id}.f{done + 1}"
            FamilyStore.insert_run(conn, run_id=run_id, agent_id=agent.agent_id, root_id=self.root_id,
                                   kind="follow_up", follows=latest.run_id, prompt=prompt, token=token)
        return self._spawn(run_id, token)

    def _check_prompt(self, prompt: str) -> None:
        limit = self.settings.max_prompt_chars
        if len(prompt) > limit:
            raise ChildPromptTooLarge(
                f"the child's prompt is {len(prompt):,} characters; at most {limit:,} are accepted "
                "(RLM_MAX_PROMPT_CHARS). The child reads the corpus itself: pass a view (context=...) and a short task",
                setting="max_prompt_chars",
            )

    def _ensure_spec(self, spec_source: Callable[[], dict[str, Any]] | None) -> None:
        if self.store.spec(self.root_id) is not None:
            return
        if spec_source is None:
            raise ChildrenUnavailable(f"family {self.root_id} has no spec to start children from")
        self.store.set_spec(self.root_id, spec_source())

    def _agent_in(self, conn: Any, agent_id: str) -> Agent:
        row = conn.execute("SELECT * FROM agents WHERE agent_id = ? AND root_id = ?",
                           (agent_id, self.root_id)).fetchone()
        if row is None:
            raise AgentNotFound(f"no agent {agent_id!r} in family {self.root_id}")
        return Agent(row["agent_id"], row["root_id"], row["parent_id"], row["depth"], json.loads(row["filters"]))

    def _check_parallel(self, conn: Any) -> None:
        active = conn.execute("SELECT COUNT(*) FROM runs WHERE root_id = ? AND state IN ('admitted', 'running')",
                              (self.root_id,)).fetchone()[0]
        limit = self.settings.max_parallel_children
        if active >= limit:
            raise ParallelChildLimitReached(
                f"{active} child runs are active in this family; max_parallel_children is {limit} "
                "(RLM_MAX_PARALLEL_CHILDREN). Wait for one (handle.wait(), rlm.wait_all) or cancel one",
                setting="max_parallel_children",
            )

    def _check_budget(self) -> None:
        """Refuse at once when the family's allowance could not carry a child (it draws on the root's)."""
        try:
            ledger = BudgetLedger(self.settings.budget_path)
            snap = ledger.snapshot(self.root_id)
        except UsageEntryNotFound:
            raise ChildrenUnavailable(f"run {self.root_id} has no inference budget; children draw on their root's") from None
        limits = snap.limits
        kept = ledger.kept_calls(self.root_id)  # each live member's final call is not the child's to take
        if limits.max_calls is not None and snap.calls + kept + CHILD_MIN_CALLS > limits.max_calls:
            raise BudgetExhausted(
                f"the family's allowance has {max(0, limits.max_calls - snap.calls)} of {limits.max_calls} calls "
                f"left, {kept} of them kept for running members' final answers, and a child needs at least "
                f"{CHILD_MIN_CALLS}; raise --max-calls / RLM_MAX_CALLS for a new run",
                setting="max_calls",
            )
        if limits.max_usd is not None and snap.unknown_usd:
            raise BudgetUnknownUsage(f"{snap.unknown_usd} call(s) of this family have unknown cost; "
                                     "reconcile them (`rlm usage`) before starting children", setting="max_usd")
        # Calls of unknown usage count at their admission estimates, as Budget.admit counts them.
        if limits.max_tokens is not None and snap.tokens + snap.unknown_tokens_estimate >= limits.max_tokens:
            raise BudgetExhausted(f"the family's allowance of {limits.max_tokens:,} tokens is used up "
                                  "(RLM_MAX_TOKENS)", setting="max_tokens")
        if limits.max_usd is not None and snap.usd >= limits.max_usd:
            raise BudgetExhausted(f"the family's allowance of ${limits.max_usd:.4f} is used up (RLM_MAX_USD)",
                                  setting="max_usd")

    # ---------- the process ----------

    def _run_dir(self, run_id: str) -> Path:
        return self.settings.runs_dir / run_id

    def _finish(self, run_id: str, state: str, **fields: Any) -> None:
        """Record a child run's end seen from here; the final call kept for it goes back to the family."""
        self.store.finish(run_id, state, **fields)
        BudgetLedger(self.settings.budget_path).release_final(self.root_id, run_id)

    def _spawn(self, run_id: str, token: str) -> RunRecord:
        # Kept from now, so the family's other calls cannot take it before the child's process opens its
        # budget (which takes the row over); released here if the child never gets that far.
        BudgetLedger(self.settings.budget_path).keep_final(self.root_id, run_id, self.settings.final_reserve_tokens)
        run_dir = self._run_dir(run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH", "")) if p)
        command = [sys.executable, "-m", "rlmfamily.family.child_process", "--data-dir", str(self.settings.data_dir),
                   "--run", run_id, "--token", token]
        try:
            with open(run_dir / RUNNER_LOG, "ab") as log:
                # Its own session: a Ctrl-C or a kill of the parent's group does not reach the child.
                proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True, close_fds=True)
        except OSError as exc:
            self._finish(run_id, "failed", error=f"could not start the child process: {exc}")
            raise ChildrenUnavailable(f"could not start a child process with {sys.executable}: {exc}") from None
        with _PROCS_LOCK:
            _PROCS[run_id] = proc
        self.store.set_spawned(run_id, proc.pid, procs.start_time(proc.pid))
        record = self.store.run(run_id)
        assert record is not None
        return record

    def _log_tail(self, run_id: str) -> str:
        try:
            with open(self._run_dir(run_id) / RUNNER_LOG, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
                return fh.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def _refresh(self, run: RunRecord) -> RunRecord:
        """An active run whose process is gone without a result becomes interrupted (or failed if it never started)."""
        with _PROCS_LOCK:
            proc = _PROCS.get(run.run_id)
        code = proc.poll() if proc is not None else None
        if code is not None:  # reaped: an ended child never lingers as a zombie of a long-lived parent
            with _PROCS_LOCK:
                _PROCS.pop(run.run_id, None)
        if not run.active:
            return run
        reason = None
        if proc is not None:
            if code is not None:
                reason = f"the child process exited with code {code} without a result"
        elif not self._alive_or_starting(run):
            reason = ("its process is gone (or its pid now belongs to another process: the start time or "
                      "token differ) and it wrote no result")
        if reason is None and run.state == "admitted" and time.time() - run.admitted_at > self.settings.child_start_timeout_s:
            self._stop(run)
            self._finish(run.run_id, "failed", error=(
                f"the child process did not confirm its start within {self.settings.child_start_timeout_s:g} s "
                f"(RLM_CHILD_START_TIMEOUT_S); its log: {self._log_tail(run.run_id) or '(empty)'}"))
        elif reason is not None:
            tail = self._log_tail(run.run_id) if run.state == "admitted" else ""
            if run.state == "admitted":
                self._finish(run.run_id, "failed", error=f"{reason} before it started; its log: {tail or '(empty)'}")
            else:
                self._finish(run.run_id, "interrupted", note=reason)
        fresh = self.store.run(run.run_id)
        assert fresh is not None
        return fresh

    def _alive_or_starting(self, run: RunRecord) -> bool:
        """Its process is proven, or it has none yet and the process that admitted it lives (it spawns it next)."""
        if run.pid is None:
            if run.owner_pid and procs.alive(run.owner_pid, run.owner_start):
                return True
            # The admitting process is gone, so the pid it may have recorded since this row was read is final.
            run = self.store.run(run.run_id) or run
        return procs.proven(run.pid, run.pid_start, run.token)

    def _refresh_active(self) -> None:
        for run in self.store.runs(self.root_id, active_only=True):
            self._refresh(run)

    def _stop(self, run: RunRecord) -> None:
        with _PROCS_LOCK:
            proc = _PROCS.pop(run.run_id, None)
        extra = [(run.kernel_pid, run.kernel_start)] if run.kernel_pid and run.kernel_start else []
        if proc is not None:
            start = run.pid_start or procs.start_time(proc.pid)
            procs.stop_tree(proc.pid, start, self.settings.child_cancel_grace_s, extra=extra)
            try:
                proc.wait(timeout=max(5.0, self.settings.child_cancel_grace_s))
            except subprocess.TimeoutExpired:
                pass
        elif run.pid and procs.proven(run.pid, run.pid_start, run.token):
            procs.stop_tree(run.pid, run.pid_start, self.settings.child_cancel_grace_s, extra=extra)
        elif extra:
            procs.stop_tree(0, None, self.settings.child_cancel_grace_s, extra=extra)

    # ---------- handles ----------

    def _child_agent(self, caller_id: str | None, child: str) -> Agent:
        """The agent named by a run id or agent id, if ``caller_id`` is its parent (None: any agent of the family)."""
        child = str(child)
        run = self.store.run(child)
        agent = self.store.agent(run.agent_id if run is not None else child)
        if agent is None or agent.root_id != self.root_id or agent.depth == 0 or (
                caller_id is not None and agent.parent_id != caller_id):
            raise ChildNotFound(f"{child!r} is not a child of {caller_id or 'this family'}; "
                                "rlm.children() lists yours")
        return agent

    def get(self, caller_id: str | None, run_id: str) -> RunRecord:
        """A run of one of ``caller_id``'s children (None: any run of the family), liveness refreshed."""
        run = self.store.run(str(run_id))
        if run is None or run.root_id != self.root_id:
            raise ChildNotFound(f"no child run {run_id!r} in this family; rlm.children() lists yours")
        self._child_agent(caller_id, run.agent_id)
        return self._refresh(run)

    def children(self, caller_id: str | None) -> list[RunRecord]:
        """The runs of ``caller_id``'s children (None: every child run of the family), oldest first."""
        runs = self.store.runs(self.root_id, parent_id=caller_id) if caller_id else self.store.runs(self.root_id)
        return [self._refresh(r) for r in runs]

    def wait(self, caller_id: str | None, run_id: str, timeout_s: float) -> RunRecord:
        """Wait until the run ends or ``timeout_s`` passes; a timeout leaves it running."""
        return self.wait_all(caller_id, [run_id], timeout_s)[0]

    def wait_all(self, caller_id: str | None, run_ids: list[str], timeout_s: float) -> list[RunRecord]:
        deadline = time.monotonic() + max(0.0, timeout_s)
        runs = [self.get(caller_id, r) for r in run_ids]
        while True:
            runs = [self._refresh(self.store.run(r.run_id) or r) if r.active else r for r in runs]
            left = deadline - time.monotonic()
            if not any(r.active for r in runs) or left <= 0:
                return runs
            time.sleep(min(POLL_S, left))

    def cancel(self, caller_id: str | None, run_id: str, *, note: str = "cancelled by its parent") -> RunRecord:
        """Stop the run's process tree (its own children first) and record it cancelled.

        A run that ended before the stop keeps its outcome (the first end wins).
        """
        run = self.get(caller_id, run_id)
        if not run.active:
            return run
        below = [a.agent_id for a in self.store.agents(self.root_id) if a.agent_id.startswith(run.agent_id + ".")]
        stopped = [run.run_id]
        for agent_id in sorted(below, key=len, reverse=True):
            for sub in self.store.runs(self.root_id, agent_id=agent_id, active_only=True):
                self._stop(sub)
                self._finish(sub.run_id, "cancelled", note=f"its ancestor {run.agent_id} was cancelled")
                stopped.append(sub.run_id)
        self._stop(run)
        self._finish(run.run_id, "cancelled", note=note)
        self._end_stopped_jobs(stopped)
        fresh = self.store.run(run.run_id)
        assert fresh is not None
        return fresh

    def _end_stopped_jobs(self, run_ids: list[str]) -> None:
        """The cancelled runs' command jobs (the python-bash profile) whose groups the stop killed, verified gone,
        end ``killed`` by ``cancel`` and give back their workspace leases; no ``rlm jobs release`` is needed.
        In a container the command's group is not this machine's to verify: those stay ``unknown``."""
        if self.settings.kernel == "container" or not self.settings.jobs_path.is_file():
            return
        from rlmfamily.bash.store import JobStore

        JobStore(self.settings.jobs_path, output_dir=self.settings.runs_dir).end_stopped(run_ids, by="cancel")

    # ---------- restart ----------

    def recover(self) -> list[dict[str, Any]]:
        """After a restart: every child run of the family with what it became.

        ``outcome`` is ``reattached`` (still running, identity proven: handles work
        again), ``recovered`` (it ended, its result is in the record) or
        ``interrupted`` (its process is gone without a result; marked now).
        """
        report = []
        for run in self.store.runs(self.root_id):
            was_active = run.active
            fresh = self._refresh(run)
            if fresh.active:
                outcome = "reattached"
            elif was_active:
                outcome = fresh.state if fresh.state in ("interrupted", "failed") else "recovered"
            else:
                outcome = "recovered"
            report.append({"run_id": fresh.run_id, "agent_id": fresh.agent_id, "state": fresh.state,
                           "outcome": outcome})
        return report


def summary(run: RunRecord, *, max_answer_chars: int | None = None) -> dict[str, Any]:
    """What a parent (or the final record) sees of a child run: small, JSON-like."""
    answer = run.answer
    if answer is not None and max_answer_chars is not None and len(answer) > max_answer_chars:
        answer = answer[:max_answer_chars]
    now = run.finished_at or time.time()
    return {
        "id": run.run_id, "agent": run.agent_id, "kind": run.kind, "follows": run.follows, "state": run.state,
        "answer": answer, "stop_reason": run.stop_reason, "error": run.error, "note": run.note,
        "prompt": run.prompt[:SUMMARY_PROMPT_CHARS], "elapsed_s": round(now - run.admitted_at, 3),
    }
