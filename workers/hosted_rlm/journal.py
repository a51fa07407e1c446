"""The journal of one rlm run (the rlm executor's run of a specialist's task) in PostgreSQL: its record, its model
calls, its steps, and the resume plan.

Written as the run goes (migration 0070), every write fenced by the job's claim
(``store.check_fence``):

- a **model call** is recorded before it is sent (``started``) and resolved once:
  ``completed`` (with the answer and the reported tokens and cost; NULL usage is
  unknown, never zero), ``failed`` (the provider refused before doing work: a known
  zero) or ``unknown`` (nobody can know what it cost);
- a **step** is recorded when it starts (with the checkpoint it starts from) and
  when it ends (with its result and the answer it set, if any).

One WAL flush per model call: a call's start is the one write that waits for its
flush, because a call must be on disk before it is sent (a call nobody recorded
could be paid and never known). Every other write of the run (the call's answer,
a replay, a step's start and end) commits with ``synchronous_commit`` off: it is
visible at once (a killed worker loses nothing), and reaches disk at the latest
with the next call's start or the run's end (``end_run``, synchronous), because
PostgreSQL flushes its WAL in order. A PostgreSQL crash can therefore lose only
the tail since the last call was sent: an answer not yet on disk leaves its call
``started``, which the resume makes ``unknown`` (never charged, counted as used)
and asks again; a step's end not yet on disk makes the step the interrupted one.
Money stays exactly-once: a charge needs a ``completed`` row, and a call
superseded by its replacement counts once.

A replacement worker reads it back as a ``ResumePlan``: root turns and steps that
completed are replayed instead of run again, answered semantic calls of the
interrupted step are served from the journal instead of being paid again, and
calls that were in flight become ``unknown`` and are ``superseded_by`` the call
that replaces them. Counting semantic calls ignores superseded rows, so a resume
never makes a customer pay for a call twice.

This module is the one owner of ``specialist_runs``, ``specialist_calls`` and
``specialist_steps`` (the rlm executor's tables: their names predate the glossary of
docs/ARCHITECTURE.md and become ``rlm_*`` in the release that contracts the schema):
the finish's settlement reads a run through ``RUN_RECORD`` (``workers.hosted_rlm.usage``),
operators through ``usage_by_job`` and ``usage_calls``. Its columns ``tariff_credits`` and
``credits_to_settle`` hold the run's reserved credits and charged credits, and are read
under those names.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, TextClause, text

from core import db
from core.specs import PricingSpec
from core.fragments import Fragment
from taskstate import charge, claims, ids
from rlmfamily.kernels.base import StepResult
from rlmfamily.kernels.checkpoints import Checkpoint
from rlmfamily.providers.base import Completion, ToolCall, Usage
from workers.hosted_rlm.store import HELD, RELAXED_COMMIT, check_fence, claim_lost

MAX_NOTE_CHARS = 500  # of the note on a model call that ended without an answer (kept for the operator)
IN_FLIGHT_NOTE = "in flight when the worker running it stopped; its usage is unknown"


def pricing_of(spec: PricingSpec) -> charge.Pricing:
    """A spec's pricing, as the charge rule takes it."""
    return charge.Pricing(spec.mode, spec.base_credits or 0, spec.credits_per_semantic_call or 0,
                          spec.credits_per_cpu_second or 0)


@dataclass(frozen=True)
class RunRecord:
    """What the finish's transaction reads of a run: the pricing it was opened under, and its semantic calls
    (a call superseded after a resume counts once)."""

    pricing: charge.Pricing
    semantic_calls_used: int
    semantic_calls_charged: int
    resumes: int


# ``run_record`` of the job ``:job_id`` (pricing, base_credits, credits_per_semantic_call, credits_per_cpu_second,
# resumes, used, charged;
# no row: not an rlm run), for the finish's one statement.
RUN_RECORD = Fragment.of("workers.hosted_rlm.journal", """
        SELECT r.pricing, r.base_credits, r.credits_per_semantic_call, r.credits_per_cpu_second, r.resumes,
               count(c.call_id) FILTER (WHERE c.purpose = 'subcall' AND c.superseded_by IS NULL) AS used,
               count(c.call_id) FILTER (WHERE c.purpose = 'subcall' AND c.superseded_by IS NULL
                                          AND c.state = 'completed') AS charged
          FROM specialist_runs r LEFT JOIN specialist_calls c ON c.job_id = r.job_id
         WHERE r.job_id = :job_id
         GROUP BY r.job_id""", ("job_id",))
_RUN_RECORD = RUN_RECORD.standalone("journal.run_record")


def run_record_of(row: Any) -> RunRecord | None:
    """A ``RUN_RECORD`` row (None, or its columns NULL: not an rlm run) as a RunRecord."""
    if row is None or row.pricing is None:
        return None
    pricing = charge.Pricing(row.pricing, int(row.base_credits or 0), int(row.credits_per_semantic_call or 0),
                             int(row.credits_per_cpu_second or 0))
    return RunRecord(pricing, int(row.used), int(row.charged), int(row.resumes))


def run_record(conn: Connection, job_id: str) -> RunRecord | None:
    """The run of a job, in the caller's transaction; None: the job is not an rlm run."""
    return run_record_of(_RUN_RECORD.execute(conn, {"job_id": job_id}).one_or_none())


def completion_to_json(completion: Completion) -> dict[str, Any]:
    return {
        "text": completion.text,
        "tool_calls": [{"id": c.id, "name": c.name, "code": c.code} for c in completion.tool_calls],
        "model": completion.model,
        "usage": None if completion.usage is None else {
            "prompt_tokens": completion.usage.prompt_tokens,
            "completion_tokens": completion.usage.completion_tokens,
            "cost_usd": completion.usage.cost_usd,
        },
    }


def completion_from_json(data: dict[str, Any]) -> Completion:
    usage = data.get("usage")
    return Completion(
        text=data["text"],
        tool_calls=tuple(ToolCall(c["id"], c["name"], c["code"]) for c in data.get("tool_calls", [])),
        usage=None if usage is None else Usage(usage["prompt_tokens"], usage["completion_tokens"], usage["cost_usd"]),
        model=data["model"],
    )


def step_to_json(result: StepResult) -> dict[str, Any]:
    return {
        "ok": result.ok,
        "stdout": result.stdout,
        "stdout_truncated": result.stdout_truncated,
        "stdout_bytes": result.stdout_bytes,
        "error_code": result.error_code,
        "error": result.error,
        "duration_s": result.duration_s,
        "restored_from_checkpoint": result.restored_from_checkpoint,
    }


def step_from_json(data: dict[str, Any]) -> StepResult:
    return StepResult(**data)


@dataclass(frozen=True)
class Replayable:
    call_id: int
    response: dict[str, Any]


@dataclass(frozen=True)
class StepRecord:
    turn: int
    index: int
    base_seq: int
    result: dict[str, Any] | None
    answer: str | None
    refusals: dict[str, int]


@dataclass
class ResumePlan:
    """What a resumed run replays, and where it continues. Built once, from the journal and the newest checkpoint."""

    latest_seq: int
    pending_seq: int | None  # the newest record is a step suspended at a host call
    # The idle session record the resume restores: the newest, or the one the newest snapshot stands on. Steps that
    # ended but started from it or later (the records after them were held, store.CheckpointPolicy) run again.
    restored_seq: int = 0
    rerun: set[tuple[int, int]] = field(default_factory=set)
    root: dict[int, Replayable] = field(default_factory=dict)  # answered root turns
    root_in_flight: dict[int, int] = field(default_factory=dict)  # turn -> call id (now unknown)
    steps: dict[tuple[int, int], StepRecord] = field(default_factory=dict)  # completed steps
    interrupted: StepRecord | None = None
    # Answered semantic calls the interrupted step will ask again (after its pending checkpoint), by request.
    replay_pool: dict[bytes, deque[Replayable]] = field(default_factory=lambda: defaultdict(deque))
    subcalls_in_flight: dict[bytes, deque[int]] = field(default_factory=lambda: defaultdict(deque))
    # (prompt sent, answer or error) of the sub-calls each step made before, for its history, in order.
    step_subcalls: dict[tuple[int, int], list[tuple[str, str]]] = field(default_factory=lambda: defaultdict(list))
    baked_subcalls: int = 0  # semantic calls spent that no replay will ask again (they count against the limit)

    @property
    def root_turns_done(self) -> int:
        turn = 0
        while turn + 1 in self.root:
            turn += 1
        return turn

    @property
    def last_replayed_turn(self) -> int:
        return max([self.root_turns_done, *(t for t, _ in self.steps)], default=0)


# The forms of ``Journal._fenced``'s statement: one per kind of write (a call's start, answer, failure, replay, a
# step's start and end, the run's opening and end).
FENCED_STATEMENTS = 32


@functools.lru_cache(maxsize=FENCED_STATEMENTS)
def _fenced_statement(sql: str) -> TextClause:
    """A fenced write's statement, parsed once per form: ``db.hot_rows`` runs it on the driver (kept by identity),
    a model call's start and answer each 0.2 ms of CPU less than through SQLAlchemy's execution (issue 44)."""
    return text(sql)


class Journal:
    """Reads and writes one job's journal as claim ``fencing_token``."""

    def __init__(self, engine: Engine, *, job_id: str, fencing_token: int) -> None:
        self.engine = engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.job_id = job_id
        self.fencing_token = fencing_token

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {"j": self.job_id, "t": self.fencing_token, **extra}

    def _fenced(self, write: str, params: dict[str, Any], *, returning: str = "NULL", then: str | None = None,
                flush: bool = False) -> Any:
        """One fenced write as one autocommit statement: the claim's share lock (``claims.fence_cte``), then
        ``write`` (which must hold ``HELD`` in its condition), one round trip and one
        commit instead of BEGIN, the fence, the write and COMMIT. Raises ClaimLost as ``check_fence`` does;
        returns ``returning`` (an expression over the ``written`` relation). ``then``: one more common table
        expression, after the write (it may read ``written``). ``flush``: the commit waits for its WAL flush
        (a call's start); otherwise it commits with ``synchronous_commit`` off (see the module's opening)."""
        # A write without the condition would commit before the lost claim is noticed: none may leave it out.
        assert all(HELD in part for part in (write, then) if part), "a fenced write must be conditional on the fence"
        relaxed = "" if flush else RELAXED_COMMIT
        statement = _fenced_statement(
            f"WITH {claims.fence_cte()}, written AS ({write}){', ' + then if then else ''} "
            f"SELECT {HELD} AS held, {returning} AS value{relaxed}"
        )
        with self._autocommit.connect() as conn:
            [row] = db.hot_rows(conn, statement, params)
        if not row["held"]:
            raise claim_lost(self.job_id, self.fencing_token)
        return row["value"]

    # --- the run ------------------------------------------------------------------------

    def open_run(self, *, specialist_id: str, route: str, pricing: PricingSpec, reserved_credits: int,
                 session_id: str) -> int:
        """Record the run (first delivery) or find it (a resume), with the credits its task reserved (the run
        context's); returns how many times it was resumed. One fenced statement (``_fenced``: it was BEGIN, the
        fence, the insert, a read and COMMIT), committed without waiting for its flush like every write of the run
        but a call's start, which flushes it first: a run lost with PostgreSQL before its first call is opened
        again by its resume. A resumed run's row exists (the claim counted the resume in it): its ``resumes``."""
        return int(self._fenced(
            "INSERT INTO specialist_runs (job_id, specialist_id, route, pricing, tariff_credits, base_credits, "
            "credits_per_semantic_call, credits_per_cpu_second, session_id) "
            f"SELECT :j, :sp, :r, :p, :tc, :base, :per, :cpu, :sid WHERE {HELD} "
            "ON CONFLICT (job_id) DO NOTHING RETURNING resumes",
            self._params(sp=specialist_id, r=route, p=pricing.mode, tc=reserved_credits, base=pricing.base_credits,
                         per=pricing.credits_per_semantic_call, cpu=pricing.credits_per_cpu_second, sid=session_id),
            returning="COALESCE((SELECT resumes FROM written), "
                      "(SELECT resumes FROM specialist_runs WHERE job_id = :j))",
        ))

    def end_run(self, *, outcome: str, stop_reason: str | None, turns: int, totals: dict[str, Any],
                charged_credits: int | None) -> None:
        """Record how the run ended, its call ``totals`` (``totals()``, read by the caller for the charge rule) and
        the charge rule's figure for it: one fenced statement whose commit waits for its flush (the run's end
        makes every relaxed write before it durable). The totals cannot move in between: only this claim writes
        the job's calls, and a claim lost meanwhile refuses the write."""
        assert charged_credits is None or charged_credits >= 0, charged_credits
        self._fenced(
            "UPDATE specialist_runs SET state = 'ended', ended_at = now(), outcome = :o, stop_reason = :sr, "
            "turns = :turns, semantic_calls_used = :used, semantic_calls_charged = :charged, "
            f"credits_to_settle = :credits WHERE job_id = :j AND {HELD} RETURNING 1",
            self._params(o=outcome, sr=stop_reason, turns=turns, used=totals["semantic_calls_used"],
                         charged=totals["semantic_calls_charged"], credits=charged_credits),
            flush=True,
        )

    def totals(self) -> dict[str, Any]:
        with self.engine.connect() as conn:
            return self._totals(conn)

    def _totals(self, conn: Any) -> dict[str, Any]:
        row = conn.execute(
            text(
                """
                SELECT
                  count(*) FILTER (WHERE purpose = 'subcall' AND superseded_by IS NULL) AS used,
                  count(*) FILTER (WHERE purpose = 'subcall' AND superseded_by IS NULL AND state = 'completed')
                    AS charged,
                  count(*) FILTER (WHERE purpose = 'root') AS root_calls,
                  count(*) AS calls,
                  sum(replays) AS replays,
                  count(*) FILTER (WHERE state IN ('started', 'unknown')
                                   OR (state = 'completed' AND (prompt_tokens IS NULL OR completion_tokens IS NULL)))
                    AS unknown_tokens,
                  count(*) FILTER (WHERE state IN ('started', 'unknown') OR (state = 'completed' AND cost_usd IS NULL))
                    AS unknown_cost,
                  sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens,
                  sum(cost_usd) AS cost_usd
                FROM specialist_calls WHERE job_id = :j
                """
            ),
            {"j": self.job_id},
        ).one()
        return {
            "semantic_calls_used": int(row.used),
            "semantic_calls_charged": int(row.charged),
            "root_calls": int(row.root_calls),
            "model_calls": int(row.calls),
            "replayed_calls": int(row.replays or 0),
            "calls_with_unknown_tokens": int(row.unknown_tokens),
            "calls_with_unknown_cost": int(row.unknown_cost),
            "prompt_tokens": int(row.prompt_tokens or 0),
            "completion_tokens": int(row.completion_tokens or 0),
            "cost_usd": float(row.cost_usd or 0),
        }

    # --- model calls --------------------------------------------------------------------

    def start_call(
        self, *, purpose: str, turn: int, step_index: int | None, after_seq: int | None, request_sha256: bytes,
        request_text: str | None, model: str | None, supersedes: int | None = None,
    ) -> int:
        # The new call, and (the first call after a resume) the in-flight call it replaces marked superseded by it.
        return int(self._fenced(
            "INSERT INTO specialist_calls (job_id, fencing_token, purpose, turn, step_index, after_seq, "
            "request_sha256, request_text, model, state) "
            f"SELECT :j, :t, :p, :turn, :step, :seq, :sha, :req, :m, 'started' WHERE {HELD} "
            "RETURNING call_id",
            self._params(p=purpose, turn=turn, step=step_index, seq=after_seq, sha=request_sha256, req=request_text,
                         m=model, old=supersedes),
            then="superseded AS (UPDATE specialist_calls SET superseded_by = (SELECT call_id FROM written) "
                 f"WHERE call_id = CAST(:old AS bigint) AND job_id = :j AND {HELD})",
            returning="(SELECT call_id FROM written)",
            flush=True,  # on disk before the call is sent, with everything the run wrote before it
        ))

    def complete_call(self, call_id: int, completion: Completion) -> None:
        usage = completion.usage
        self._resolve(
            call_id,
            state="completed",
            response=completion_to_json(completion),
            prompt_tokens=None if usage is None else usage.prompt_tokens,
            completion_tokens=None if usage is None else usage.completion_tokens,
            cost_usd=None if usage is None else usage.cost_usd,
            model=completion.model,
            note=None if usage is not None else "the provider reported no usage",
        )

    def fail_call(self, call_id: int, *, billed: bool | None, note: str) -> None:
        if billed is False:  # refused before any work: a known zero
            self._resolve(call_id, state="failed", prompt_tokens=0, completion_tokens=0, cost_usd=0.0, note=note)
        else:
            self._resolve(call_id, state="unknown", note=note)

    def _resolve(self, call_id: int, *, state: str, response: dict[str, Any] | None = None,
                 prompt_tokens: int | None = None, completion_tokens: int | None = None,
                 cost_usd: float | None = None, model: str | None = None, note: str | None = None) -> None:
        self._fenced(
            "UPDATE specialist_calls SET state = :s, response = CAST(:r AS jsonb), prompt_tokens = :pt, "
            "completion_tokens = :ct, cost_usd = :c, model = COALESCE(:m, model), note = :n, ended_at = now() "
            f"WHERE call_id = :id AND job_id = :j AND state = 'started' AND {HELD}",
            self._params(s=state, r=None if response is None else json.dumps(response), pt=prompt_tokens,
                         ct=completion_tokens, c=cost_usd, m=model, n=None if note is None else note[:MAX_NOTE_CHARS],
                         id=call_id),
        )

    def replayed(self, call_id: int) -> None:
        self._fenced(
            f"UPDATE specialist_calls SET replays = replays + 1 WHERE call_id = :id AND job_id = :j AND {HELD}",
            self._params(id=call_id),
        )

    # --- steps --------------------------------------------------------------------------

    def start_step(self, turn: int, index: int, base_seq: int) -> None:
        self._fenced(
            "INSERT INTO specialist_steps (job_id, turn, step_index, fencing_token, base_seq) "
            f"SELECT :j, :turn, :i, :t, :b WHERE {HELD}",
            self._params(turn=turn, i=index, b=base_seq),
        )

    def finish_step(self, turn: int, index: int, result: StepResult, *, answer: str | None,
                    refusals: dict[str, int]) -> None:
        self._fenced(
            "UPDATE specialist_steps SET result = CAST(:r AS jsonb), answer = :a, refusals = CAST(:f AS jsonb), "
            "fencing_token = :t, ended_at = now() WHERE job_id = :j AND turn = :turn AND step_index = :i "
            f"AND {HELD}",
            self._params(r=json.dumps(step_to_json(result)), a=answer, f=json.dumps(refusals), turn=turn, i=index),
        )

    def refusals(self) -> dict[str, int]:
        """Semantic calls refused inside the sandbox, by reason, over every recorded step."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT refusals FROM specialist_steps WHERE job_id = :j AND refusals IS NOT NULL"),
                {"j": self.job_id},
            ).scalars()
            total: dict[str, int] = defaultdict(int)
            for refusals in rows:
                for code, count in (refusals or {}).items():
                    total[code] += int(count)
            return dict(total)

    # --- resume -------------------------------------------------------------------------

    def plan(self, latest: Checkpoint) -> ResumePlan:
        """Read the journal back for a resume from ``latest``; calls that were in flight become unknown."""
        with self.engine.begin() as conn:
            check_fence(conn, self.job_id, self.fencing_token)
            conn.execute(
                text(
                    "UPDATE specialist_calls SET state = 'unknown', note = :n, ended_at = now() "
                    "WHERE job_id = :j AND state = 'started'"
                ),
                {"j": self.job_id, "n": IN_FLIGHT_NOTE},
            )
            calls = conn.execute(
                text(
                    "SELECT call_id, purpose, turn, step_index, after_seq, request_sha256, request_text, state, "
                    "superseded_by, response, note FROM specialist_calls WHERE job_id = :j "
                    "ORDER BY ended_at NULLS LAST, call_id"
                ),
                {"j": self.job_id},
            ).mappings().all()
            steps = conn.execute(
                text(
                    "SELECT turn, step_index, base_seq, result, answer, refusals FROM specialist_steps "
                    "WHERE job_id = :j ORDER BY turn, step_index"
                ),
                {"j": self.job_id},
            ).mappings().all()

        pending_seq = latest.seq if latest.kind == "pending_call" else None
        restored_seq = latest.pending.base_seq if latest.pending is not None else latest.seq
        plan = ResumePlan(latest_seq=latest.seq, pending_seq=pending_seq, restored_seq=restored_seq)
        for row in steps:
            record = StepRecord(int(row["turn"]), int(row["step_index"]), int(row["base_seq"]), row["result"],
                                row["answer"], dict(row["refusals"] or {}))
            if record.result is not None:
                plan.steps[(record.turn, record.index)] = record
                if record.base_seq >= restored_seq:  # its effects are not in the record restored
                    plan.rerun.add((record.turn, record.index))
            else:
                plan.interrupted = record  # at most one step is ever left unfinished: steps run one at a time
        interrupted = None if plan.interrupted is None else (plan.interrupted.turn, plan.interrupted.index)
        for row in calls:
            if row["superseded_by"] is not None:
                continue
            sha = bytes(row["request_sha256"])
            if row["purpose"] == "root":
                if row["state"] == "completed":
                    plan.root[int(row["turn"])] = Replayable(int(row["call_id"]), row["response"])
                elif row["note"] == IN_FLIGHT_NOTE:
                    plan.root_in_flight[int(row["turn"])] = int(row["call_id"])
                continue
            where = (int(row["turn"]), row["step_index"])
            asked_again = (
                where == interrupted and pending_seq is not None and row["after_seq"] is not None
                and int(row["after_seq"]) >= pending_seq
            )
            if row["note"] == IN_FLIGHT_NOTE:
                if asked_again:
                    plan.subcalls_in_flight[sha].append(int(row["call_id"]))
                else:
                    plan.baked_subcalls += 1
                continue
            if asked_again:
                if row["state"] == "completed":
                    plan.replay_pool[sha].append(Replayable(int(row["call_id"]), row["response"]))
                else:  # a failure the interrupted step never saw: spent, and asked again as a new call
                    plan.baked_subcalls += 1
                continue
            plan.baked_subcalls += 1
            answer = (row["response"] or {}).get("text") if row["state"] == "completed" else (row["note"] or "")
            plan.step_subcalls[where].append((row["request_text"] or "", answer or ""))
        return plan


# --- what runs used, for operators (``specialists usage``) -----------------------------------
# Tokens and cost are the sums of what providers reported. A call whose usage nobody knows (in flight when
# a worker died, a timeout, an answer without usage, a model without a price) is counted apart and never as
# zero: a total next to a non-zero ``calls_with_unknown_*`` is a lower bound.
# ``cpu_seconds``: the CPU seconds of the job's processes together in its last claim's run (``workers.cpu_share``, kept
# in the claim's record, ``claims.cpu_seconds_of``); None: not measured (a run in a thread of the worker, one not
# finished, or whose process died).

MAX_ROWS = 1000

# One row per run with its calls' totals; ``{runs}`` is the condition that picks the runs.
_JOBS_TEMPLATE = """
    SELECT r.job_id, r.specialist_id, r.route, r.state, r.outcome, r.stop_reason, r.resumes, r.turns,
           r.semantic_calls_used, r.semantic_calls_charged, r.pricing,
           r.tariff_credits AS reserved_credits, r.credits_to_settle AS charged_credits,
           r.started_at, r.ended_at,
           count(c.call_id) AS model_calls,
           coalesce(sum(c.replays), 0) AS replayed_calls,
           coalesce(sum(c.prompt_tokens), 0) AS prompt_tokens,
           coalesce(sum(c.completion_tokens), 0) AS completion_tokens,
           coalesce(sum(c.cost_usd), 0) AS cost_usd,
           count(c.call_id) FILTER (WHERE c.state IN ('started', 'unknown')
                                    OR (c.state = 'completed' AND (c.prompt_tokens IS NULL OR c.completion_tokens IS NULL)))
             AS calls_with_unknown_tokens,
           count(c.call_id) FILTER (WHERE c.state IN ('started', 'unknown')
                                    OR (c.state = 'completed' AND c.cost_usd IS NULL)) AS calls_with_unknown_cost
      FROM specialist_runs r LEFT JOIN specialist_calls c ON c.job_id = r.job_id
     WHERE (CAST(:sp AS text) IS NULL OR r.specialist_id = :sp)
       AND {runs}
       AND (CAST(:since AS timestamptz) IS NULL OR r.started_at >= :since)
       AND (CAST(:until AS timestamptz) IS NULL OR r.started_at < :until)
     GROUP BY r.job_id
     ORDER BY r.started_at DESC, r.job_id
     LIMIT :n
    """
_JOBS = text(_JOBS_TEMPLATE.format(runs="(CAST(:job AS text) IS NULL OR r.job_id = :job)"))
# The runs of one task: its jobs (`<task id>.<dispatch id>`) through the index of that expression
# (specialist_runs_task, migration 0220).
_TASK_JOBS = text(_JOBS_TEMPLATE.format(runs=f"{ids.task_id_of_sql('r.job_id')} = :task"))

_CALLS = text(
    """
    SELECT call_id, purpose, turn, step_index, state, model, prompt_tokens, completion_tokens, cost_usd, replays,
           superseded_by, fencing_token AS claim, note, started_at, ended_at
      FROM specialist_calls WHERE job_id = :job ORDER BY call_id LIMIT :n
    """
)


def usage_by_job(conn: Connection, *, specialist_id: str | None = None, job_id: str | None = None,
                 since: datetime | None = None, until: datetime | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """One row per job, newest first; with ``since``/``until``, the jobs started in [since, until)."""
    rows = conn.execute(
        _JOBS, {"sp": specialist_id, "job": job_id, "since": since, "until": until, "n": max(1, min(limit, MAX_ROWS))}
    ).mappings()
    return _with_cpu(conn, rows)


def usage_by_task(conn: Connection, task_id: str, *, limit: int = 50) -> list[dict[str, Any]]:
    """One row per rlm job of the task ``task_id`` (an A2A task's id), newest first."""
    rows = conn.execute(_TASK_JOBS, {"sp": None, "task": task_id, "since": None, "until": None,
                                     "n": max(1, min(limit, MAX_ROWS))}).mappings()
    return _with_cpu(conn, rows)


def _with_cpu(conn: Connection, rows: Any) -> list[dict[str, Any]]:
    """The runs' rows with their jobs' CPU seconds, read from their claims' records (one more statement)."""
    jobs = [{**row, "cost_usd": float(row["cost_usd"])} for row in rows]
    cpu = claims.cpu_seconds_of(conn, [job["job_id"] for job in jobs])
    return [{**job, "cpu_seconds": cpu.get(job["job_id"])} for job in jobs]


def usage_calls(conn: Connection, job_id: str, *, limit: int = MAX_ROWS) -> list[dict[str, Any]]:
    """Every model call of one job, in order, with what it reported (None: unknown)."""
    rows = conn.execute(_CALLS, {"job": job_id, "n": max(1, min(limit, MAX_ROWS))}).mappings()
    return [{**row, "cost_usd": None if row["cost_usd"] is None else float(row["cost_usd"])} for row in rows]
