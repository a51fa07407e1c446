"""Random sequences of ledger operations against a simple in-memory model (hypothesis stateful testing).

Each example gets a fresh customer and its own clock, advanced explicitly (expiry is
tested by passing ``now``, never by sleeping). After every step the database's lots and
account must equal the model's; at the end of every example ``verify`` must be clean.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ledger import statements as sql
from ledger.errors import AdjustRefused, GrantRefused, LedgerInputInvalid, ResolutionRefused
from ledger.limits import default_limits
from ledger.client import Ledger
from ledger.results import ReserveResult, ResolveResult

SKILLS = ("review", "translate")


@dataclass
class ModelLot:
    lot_id: int
    priority: int
    expires_at: datetime | None
    granted: int
    held: int = 0
    spent: int = 0
    expired: int = 0
    removed: int = 0
    swept: bool = False

    @property
    def remaining(self) -> int:
        return self.granted - self.held - self.spent - self.expired - self.removed

    def usable(self, now: datetime) -> bool:
        return not self.swept and (self.expires_at is None or self.expires_at > now)

    def gone(self, now: datetime) -> bool:
        return self.swept or (self.expires_at is not None and self.expires_at <= now)

    def numbers(self) -> tuple[int, int, int, int, int]:
        return (self.granted, self.held, self.spent, self.expired, self.removed)


@dataclass
class ModelReservation:
    job_id: str
    fingerprint: str
    credits: int
    holds: list[tuple[int, int]]
    state: str = "open"
    charged: int | None = None


@dataclass
class Model:
    lots: dict[int, ModelLot] = field(default_factory=dict)
    entitlements: list[tuple[str, datetime | None]] = field(default_factory=list)
    reservations: dict[str, ModelReservation] = field(default_factory=dict)
    max_parallel: int | None = None  # None: no account yet

    def drawdown(self, now: datetime) -> list[ModelLot]:
        usable = [lot for lot in self.lots.values() if lot.usable(now) and lot.remaining > 0]
        far = datetime.max.replace(tzinfo=timezone.utc)
        return sorted(usable, key=lambda lot: (lot.priority, lot.expires_at or far, lot.lot_id))

    def available(self, now: datetime) -> int:
        return sum(lot.remaining for lot in self.drawdown(now))

    def unresolved(self) -> list[ModelReservation]:
        return [r for r in self.reservations.values() if r.state in ("open", "unknown")]

    def resolve(self, reservation: ModelReservation, charged: int, now: datetime) -> tuple[int, int]:
        left, released, expired = charged, 0, 0
        for lot_id, hold in reservation.holds:
            lot = self.lots[lot_id]
            charge = min(left, hold)
            left -= charge
            lot.held -= hold
            lot.spent += charge
            if lot.gone(now):
                lot.expired += hold - charge
                expired += hold - charge
            else:
                released += hold - charge
        reservation.charged = charged
        return released, expired


class LedgerMachine(RuleBasedStateMachine):
    ledger: Ledger  # set by the test below

    def __init__(self) -> None:
        super().__init__()
        self.customer = f"sm-{uuid.uuid4().hex[:16]}"
        self.now = datetime.now(timezone.utc).replace(microsecond=0)
        self.model = Model()
        self.grant_keys: list[tuple[str, dict]] = []

    # --- helpers ------------------------------------------------------------

    def _jobs(self, *states: str) -> list[ModelReservation]:
        # Creation order, not job id order: job ids are random, and hypothesis needs the same
        # choices to draw the same values when it replays a case.
        return [r for r in self.model.reservations.values() if r.state in states]

    def _expected_reserve(self, skill: str, credits: int) -> str:
        active = [e for s, e in self.model.entitlements if s == skill]
        if not active:
            return "not_entitled"
        if not any(e is None or e > self.now for e in active):
            return "expired"
        if self.model.available(self.now) < credits:
            no_usable_lot = not any(lot.usable(self.now) for lot in self.model.lots.values())
            return "expired" if no_usable_lot and self.model.lots else "insufficient_credits"
        if len(self.model.unresolved()) >= self.model.max_parallel:
            return "concurrency_cap"
        return "created"

    # --- rules --------------------------------------------------------------

    @rule(
        credits=st.integers(0, 60),
        priority=st.sampled_from([10, 100]),
        expires_in_min=st.none() | st.integers(1, 240),
        max_parallel=st.none() | st.integers(1, 4),
        skill=st.none() | st.sampled_from(SKILLS),
        skill_expires_in_min=st.none() | st.integers(1, 240),
        with_key=st.booleans(),
    )
    def grant(self, credits, priority, expires_in_min, max_parallel, skill, skill_expires_in_min, with_key):
        kwargs = {
            "skills": [skill] if skill else [],
            "expires_at": self.now + timedelta(minutes=expires_in_min) if expires_in_min else None,
            "skill_expires_at": self.now + timedelta(minutes=skill_expires_in_min) if skill_expires_in_min else None,
            "max_parallel": max_parallel,
            "priority": priority,
            "idempotency_key": f"{self.customer}-{len(self.grant_keys)}" if with_key else None,
        }
        if credits == 0 and not skill:
            with pytest.raises(LedgerInputInvalid):
                self.ledger.grant(self.customer, credits, operator="model", now=self.now, **kwargs)
            return
        if max_parallel is not None and max_parallel < len(self.model.unresolved()):
            with pytest.raises(GrantRefused) as refused:
                self.ledger.grant(self.customer, credits, operator="model", now=self.now, **kwargs)
            assert refused.value.code == "max_parallel_below_open"
            return
        result = self.ledger.grant(self.customer, credits, operator="model", now=self.now, **kwargs)
        assert result.outcome == "created"
        if credits:
            self.model.lots[result.lot_id] = ModelLot(result.lot_id, priority, kwargs["expires_at"], credits)
        if skill:
            self.model.entitlements.append((skill, kwargs["skill_expires_at"]))
        if max_parallel is not None:
            self.model.max_parallel = max_parallel
        elif self.model.max_parallel is None:
            self.model.max_parallel = default_limits().default_max_parallel
        if with_key:
            self.grant_keys.append((credits, kwargs))

    @precondition(lambda self: self.grant_keys)
    @rule(data=st.data())
    def replay_grant(self, data):
        credits, kwargs = data.draw(st.sampled_from(self.grant_keys))
        again = self.ledger.grant(self.customer, credits, operator="model", now=self.now, **kwargs)
        assert again.outcome == "exists"

    def _check_reserve(self, job: str, skill: str, credits: int, result: ReserveResult) -> None:
        """Compare a new job's reservation with the model's answer, and apply it to the model."""
        expected = self._expected_reserve(skill, credits)
        plan: list[tuple[int, int]] = []
        need = credits
        for lot in self.model.drawdown(self.now):
            if need == 0:
                break
            take = min(need, lot.remaining)
            plan.append((lot.lot_id, take))
            need -= take
        assert result.outcome == expected, (result, expected)
        if expected == "created":
            assert [(h.lot_id, h.credits) for h in result.holds] == plan
            for lot_id, take in plan:
                self.model.lots[lot_id].held += take
            self.model.reservations[job] = ModelReservation(job, f"fp-{job}", credits, plan)

    def _check_settle(self, reservation: ModelReservation, charged: int, result: ResolveResult) -> None:
        released, expired = self.model.resolve(reservation, charged, self.now)
        reservation.state = "voided" if charged == 0 else "settled"
        assert (result.outcome, result.charged, result.released, result.expired) == ("settled", charged, released, expired)

    @rule(credits=st.integers(1, 50), skill=st.sampled_from(SKILLS))
    def reserve(self, credits, skill):
        job = f"job-{uuid.uuid4().hex}"
        result = self.ledger.reserve(self.customer, job, f"fp-{job}", skill, credits, now=self.now)
        self._check_reserve(job, skill, credits, result)

    @rule(data=st.data(), reserves=st.lists(st.tuples(st.integers(1, 50), st.sampled_from(SKILLS)), max_size=4))
    def batch(self, data, reserves):
        """Reserves and settles in one ledger_batch: as if the settlements ran first, then the reserves in order."""
        open_jobs = self._jobs("open")
        settles = []
        if open_jobs:
            settles = data.draw(st.lists(st.sampled_from(open_jobs), unique_by=lambda r: r.job_id, max_size=3))
        if not settles and not reserves:
            return
        charges = [data.draw(st.integers(0, r.credits)) for r in settles]
        jobs = [f"job-{uuid.uuid4().hex}" for _ in reserves]
        limits = self.ledger.limits
        operations = [
            ("reserve", sql.reserve_params(self.customer, job, f"fp-{job}", skill, credits, now=self.now, limits=limits))
            for job, (credits, skill) in zip(jobs, reserves)
        ] + [
            ("settle", sql.settle_params(r.job_id, charged, "done", now=self.now, limits=limits))
            for r, charged in zip(settles, charges)
        ]
        rows = self.ledger.run_batch(operations)
        for reservation, charged, row in sorted(
            zip(settles, charges, rows[len(reserves):]), key=lambda item: item[0].job_id
        ):
            self._check_settle(reservation, charged, sql.parse_resolve(row, charged=charged))
        for job, (credits, skill), row in zip(jobs, reserves, rows):
            self._check_reserve(job, skill, credits, sql.parse_reserve(row))

    @precondition(lambda self: self.model.reservations)
    @rule(data=st.data(), same=st.booleans())
    def replay_reserve(self, data, same):
        reservation = data.draw(st.sampled_from(list(self.model.reservations.values())))
        fingerprint = reservation.fingerprint if same else "another request"
        result = self.ledger.reserve(self.customer, reservation.job_id, fingerprint, "review", 1, now=self.now)
        if same:
            assert result.outcome == "exists"
            assert [(h.lot_id, h.credits) for h in result.holds] == reservation.holds
            assert result.state == reservation.state
        else:
            assert result.outcome == "exists_mismatch"

    @precondition(lambda self: self._jobs("open"))
    @rule(data=st.data())
    def settle(self, data):
        reservation = data.draw(st.sampled_from(self._jobs("open")))
        charged = data.draw(st.integers(0, reservation.credits))
        result = self.ledger.settle(reservation.job_id, charged, "done", now=self.now)
        self._check_settle(reservation, charged, result)

    @precondition(lambda self: self._jobs("settled", "voided", "reconciled"))
    @rule(data=st.data(), same=st.booleans())
    def settle_again(self, data, same):
        reservation = data.draw(st.sampled_from(self._jobs("settled", "voided", "reconciled")))
        if same:
            assert self.ledger.settle(reservation.job_id, reservation.charged, now=self.now).outcome == "exists"
        else:
            other = (reservation.charged + 1) % (reservation.credits + 1)
            with pytest.raises(ResolutionRefused) as refused:
                self.ledger.settle(reservation.job_id, other, now=self.now)
            assert refused.value.code == "settle_mismatch"

    @precondition(lambda self: self._jobs("open"))
    @rule(data=st.data())
    def mark_unknown(self, data):
        reservation = data.draw(st.sampled_from(self._jobs("open")))
        assert self.ledger.mark_unknown(reservation.job_id, "lease expired", "ops", now=self.now).outcome == "marked"
        reservation.state = "unknown"

    @precondition(lambda self: self._jobs("unknown"))
    @rule(data=st.data())
    def settle_unknown_is_refused(self, data):
        reservation = data.draw(st.sampled_from(self._jobs("unknown")))
        with pytest.raises(ResolutionRefused) as refused:
            self.ledger.settle(reservation.job_id, 0, now=self.now)
        assert refused.value.code == "reservation_unknown"

    @precondition(lambda self: self._jobs("unknown"))
    @rule(data=st.data())
    def reconcile(self, data):
        reservation = data.draw(st.sampled_from(self._jobs("unknown")))
        charged = data.draw(st.integers(0, reservation.credits))
        result = self.ledger.reconcile(reservation.job_id, charged, "checked the logs", "ops", now=self.now)
        released, expired = self.model.resolve(reservation, charged, self.now)
        reservation.state = "reconciled"
        assert (result.outcome, result.charged, result.released, result.expired) == (
            "reconciled",
            charged,
            released,
            expired,
        )

    @rule()
    def expire(self):
        moved = {m.lot_id: m.credits for m in self.ledger.expire(now=self.now) if m.customer_id == self.customer}
        expected = {}
        for lot in self.model.lots.values():
            if not lot.swept and lot.expires_at is not None and lot.expires_at <= self.now:
                if lot.remaining > 0:
                    expected[lot.lot_id] = lot.remaining
                lot.expired += lot.remaining
                lot.swept = True
        assert moved == expected

    @rule(credits=st.integers(-40, 40).filter(bool))
    def adjust(self, credits):
        if self.model.max_parallel is None:
            with pytest.raises(AdjustRefused) as refused:
                self.ledger.adjust(self.customer, credits, "correction", "ops", now=self.now)
            assert refused.value.code == "account_not_found"
            return
        if credits < 0 and -credits > self.model.available(self.now):
            with pytest.raises(AdjustRefused) as refused:
                self.ledger.adjust(self.customer, credits, "correction", "ops", now=self.now)
            assert refused.value.code == "adjust_exceeds_available"
            return
        result = self.ledger.adjust(self.customer, credits, "correction", "ops", now=self.now)
        if credits > 0:
            (created,) = result.lots
            self.model.lots[created.lot_id] = ModelLot(created.lot_id, default_limits().default_priority, None, credits)
        else:
            need = -credits
            expected = []
            for lot in self.model.drawdown(self.now):
                if need == 0:
                    break
                take = min(need, lot.remaining)
                lot.removed += take
                need -= take
                expected.append((lot.lot_id, take))
            assert [(h.lot_id, h.credits) for h in result.lots] == expected

    @rule(minutes=st.integers(1, 120))
    def advance_clock(self, minutes):
        self.now += timedelta(minutes=minutes)

    # --- invariants -----------------------------------------------------------

    @invariant()
    def database_matches_the_model(self):
        view = self.ledger.account(self.customer, now=self.now)
        if self.model.max_parallel is None:
            assert view is None
            return
        assert {lot.lot_id: (lot.granted, lot.held, lot.spent, lot.expired, lot.removed) for lot in view.lots} == {
            lot_id: lot.numbers() for lot_id, lot in self.model.lots.items()
        }
        unresolved = self.model.unresolved()
        assert view.open_reservations == len(unresolved) <= view.max_parallel == self.model.max_parallel
        assert view.held == sum(r.credits for r in unresolved) == sum(lot.held for lot in self.model.lots.values())
        assert view.available == self.model.available(self.now) >= 0
        assert sorted((r.job_id, r.state) for r in view.unresolved) == sorted((r.job_id, r.state) for r in unresolved)

    def teardown(self):
        assert self.ledger.verify(self.customer) == []


@pytest.mark.timeout(240)
def test_random_operation_sequences_match_the_model_and_verify_clean(ledger):
    LedgerMachine.ledger = ledger
    machine = LedgerMachine.TestCase
    machine.settings = settings(
        max_examples=50,
        stateful_step_count=30,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    machine().runTest()
