"""The operator console: the ledger, the keys, the unknowns, usage, health and the journal, in a browser.

Rendered on the server (Jinja2 templates in ``templates/``, one stylesheet and one small script in ``static/``,
shipped in the package: no build step, no CDN). Every read and every action is the one the `specialists` CLI
uses (``ledger.client.Ledger``, ``ledger.keys``, ``workers.reconcile``, ``taskstate.reads``, ``ops.health``),
with the operator of the session as the journal's operator. A refusal shows the ledger's code and message and
changes nothing. ``auth`` explains who the operator is and how a request proves it is theirs.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from core.errors import ServiceError
from core.settings import Settings
from core.specs import SkillCatalogue, SkillUnknown, load_specs
from ledger import keys
from ledger.client import Ledger
from ledger.errors import LedgerError
from ops.console import auth, charts
from ops.console.auth import CSRF_FIELD, SESSION_COOKIE, Refused, Session

HERE = Path(__file__).resolve().parent
# An id a URL or a query names (customer, key, job, operator, cursor) before anything reads it: printable, no
# longer than any id the service keeps. Anything else is a 400 with the page's form, never a database error.
ID_TEXT = re.compile(r"[\x21-\x7e]{1,200}")
JOURNAL_KINDS = ("grant", "reserve", "settle", "void", "expire", "adjust", "reconcile")
RECONCILE_STATES = ("completed", "failed", "canceled")
# The ledger's refusals of a reconcile that another operator's beat: shown as "Already resolved".
ALREADY_RESOLVED = frozenset({"reservation_already_resolved", "already_resolved", "settle_mismatch"})
CUSTOMER_TASKS = 20
JOURNAL_PAGE = 50
USAGE_DEFAULT_DAYS = 14
JOBS_LISTED = 50
PUSH_FAILURES_LISTED = 50
ISSUED_COOKIE = "console_issued_key"
ISSUED_COOKIE_S = 60  # how long a key just issued waits for its page (the redirect's GET) before it is gone
CHART_CUSTOMERS = 7  # series in the chart by customer (one colour each), beside "(others)"
# The notices a redirect after a successful action may show: fixed texts, so a link cannot put words on the page.
NOTICES = {
    "granted": "Granted.",
    "adjusted": "Adjustment journalled.",
    "revoked": "Key revoked: the edge refuses it within the revocation bound.",
    "added": "Customer added.",
    "exists": "That customer already exists: nothing changed.",
    "reconciled": "Reconciled: the money moved once, the task has its final state.",
}


@dataclass
class Console:
    settings: Settings
    engine: Engine
    ledger: Ledger
    catalogue: SkillCatalogue
    sessions: auth.Sessions
    iap: auth.IapVerifier | None
    templates: Jinja2Templates
    origins: frozenset[str]
    logins: auth.LoginThrottle

    @property
    def limits(self):
        return self.settings.ledger


def create_console(settings: Settings, engine: Engine, *, iap: auth.IapVerifier | None = None) -> FastAPI:
    """The console's ASGI app (``specialists console`` serves it). Raises ``auth.ConsoleNotConfigured``."""
    auth.check_console_settings(settings.console)
    folder = settings.hosted.specs_dir
    console = Console(
        settings=settings,
        engine=engine,
        ledger=Ledger(engine, settings.ledger),
        catalogue=SkillCatalogue.of(load_specs(folder), folder),
        sessions=auth.Sessions(settings.console, engine),
        iap=iap or (auth.IapVerifier(settings.console) if settings.console.auth == "iap" else None),
        templates=Jinja2Templates(directory=str(HERE / "templates")),
        origins=auth.allowed_origins(settings.console),
        logins=auth.LoginThrottle(settings.console),
    )
    console.templates.env.filters["when"] = _when
    console.templates.env.filters["credits"] = lambda n: "-" if n is None else f"{n:,}"
    app = FastAPI(title="specialists console", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.console = console
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    app.middleware("http")(_security_headers)
    pages = Pages(console)
    for path, method, handler in pages.routes():
        app.add_api_route(path, handler, methods=[method], include_in_schema=False)
    return app


# --- responses ---------------------------------------------------------------------------------------------

# No inline script or style anywhere: the page's script and stylesheet come from /static, charts are inline SVG
# drawn with presentation attributes. Nothing may frame the console.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


async def _security_headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    response = await call_next(request)
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"
    # Same-origin: the console's own form posts keep their Origin and Referer (checked as CSRF defence).
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cross-Origin-Opener-Policy"] = "same-origin"
    if not request.url.path.startswith("/static/"):
        response.headers["Cache-Control"] = "no-store"  # balances and a key shown once are never cached
    return response


def _when(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


def _age(since: datetime | None, now: datetime) -> str:
    if since is None:
        return "-"
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


class Form:
    """A urlencoded form, read within SPECIALISTS_CONSOLE_MAX_FORM_BYTES."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        self.fields = fields

    def get(self, name: str, default: str = "") -> str:
        values = self.fields.get(name)
        return values[0].strip() if values else default

    def all(self, name: str) -> list[str]:
        return [v.strip() for v in self.fields.get(name, []) if v.strip()]

    def integer(self, name: str, what: str) -> int:
        text = self.get(name)
        try:
            return int(text)
        except ValueError:
            raise Refused(f"{what} must be a whole number, not {text!r}", code="form_invalid", status=400) from None

    def optional_integer(self, name: str, what: str) -> int | None:
        return self.integer(name, what) if self.get(name) else None


async def read_form(request: Request, max_bytes: int) -> Form:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > max_bytes):
        raise Refused(f"the form is larger than {max_bytes} bytes (SPECIALISTS_CONSOLE_MAX_FORM_BYTES)",
                      code="form_too_large", status=413)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise Refused(f"the form is larger than {max_bytes} bytes (SPECIALISTS_CONSOLE_MAX_FORM_BYTES)",
                          code="form_too_large", status=413)
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if body and kind != "application/x-www-form-urlencoded":
        raise Refused("the console takes urlencoded forms only", code="form_invalid", status=415)
    try:
        return Form(parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=100, strict_parsing=False))
    except (UnicodeDecodeError, ValueError):
        raise Refused("the form could not be read", code="form_invalid", status=400) from None


# --- pages -------------------------------------------------------------------------------------------------


class Pages:
    """Every route: GETs read, POSTs act. Each handler is wrapped by ``_guard`` (who is this, is it theirs), which
    runs it in the thread pool: the reads and operations are the CLI's, synchronous, and a long one (a whole
    ledger's verify) must not hold the event loop, and with it every other operator's page."""

    def __init__(self, console: Console) -> None:
        self.c = console

    def routes(self) -> list[tuple[str, str, Callable[..., Awaitable[Response]]]]:
        open_ = [("/healthz", "GET", self.healthz), ("/login", "GET", self.login_page),
                 ("/login", "POST", self.login)]
        guarded = [
            ("/", "GET", self.home),
            ("/logout", "POST", self.logout),
            ("/customers", "GET", self.customers),
            ("/customers", "POST", self.add_customer),
            ("/customers/{customer_id}", "GET", self.customer),
            ("/customers/{customer_id}/grant", "POST", self.grant),
            ("/customers/{customer_id}/adjust", "POST", self.adjust),
            ("/customers/{customer_id}/keys", "POST", self.issue_key),
            ("/keys/{key_id}/revoke", "POST", self.revoke_key),
            ("/reservations", "GET", self.reservations),
            ("/reservations/{job_id}/reconcile", "POST", self.reconcile),
            ("/usage", "GET", self.usage),
            ("/usage.csv", "GET", self.usage_csv),
            ("/health", "GET", self.health),
            ("/journal", "GET", self.journal),
        ]
        return open_ + [(path, method, self._guard(handler, method)) for path, method, handler in guarded]

    # --- who ---------------------------------------------------------------------------------------------

    def _guard(self, handler: Callable[..., Response], method: str) -> Callable[..., Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            try:
                session, fresh = await run_in_threadpool(self._session, request)  # IAP may fetch its keys
            except Refused as refused:
                if method == "GET" and refused.status == 401 and self.c.iap is None:
                    return RedirectResponse("/login", status_code=303)
                return self._refusal(request, refused, None)
            if session is None:
                if method == "GET":
                    return RedirectResponse("/login", status_code=303)
                return self._refusal(request, Refused("log in first", code="login_required", status=401), None)
            try:
                if method == "POST":
                    auth.check_same_origin(request, self.c.origins)
                    try:
                        form = await read_form(request, self.c.settings.console.max_form_bytes)
                    except Refused as refused:
                        if refused.code != "form_too_large":
                            raise
                        return await run_in_threadpool(self._form_page, request, session, refused)
                    auth.check_csrf(session, form.get(CSRF_FIELD))
                    response = await run_in_threadpool(handler, request, session, form)
                else:
                    response = await run_in_threadpool(handler, request, session)
            except Refused as refused:
                response = self._refusal(request, refused, session)
            if fresh is not None:
                self._set_cookie(request, response, fresh)
            return response

        return guarded

    def _form_page(self, request: Request, session: Session, refused: Refused) -> Response:
        """A form too large to read (a pasted file as a reason): the page the form is on, with the limits, so the
        operator can shorten it and send it again, rather than a bare refusal."""
        error = {"code": refused.code,
                 "message": f"{refused.message}. A reason is at most {self.c.limits.max_reason_chars} characters "
                            "(SPECIALISTS_LEDGER_MAX_REASON_CHARS): shorten it and send the form again."}
        path = request.url.path
        customer = re.fullmatch(r"/customers/([^/]+)/(grant|adjust|keys)", path)
        if customer is None and path.startswith("/keys/"):  # a revoke is posted from its customer's page
            customer = re.fullmatch(r"/customers/([^/]+)", urlsplit(request.headers.get("referer", "")).path)
        if customer is not None:
            return self.customer(request, session, customer.group(1), error=error, status=413)
        if path.startswith("/reservations/"):
            return self.reservations(request, session, error=error, status=413)
        return self.customers(request, session, error=error, status=413)

    def _session(self, request: Request) -> tuple[Session | None, str | None]:
        """The request's session, and a new cookie when one must be (re)issued (IAP: bound to the JWT's operator)."""
        session = self.c.sessions.read(request)
        if self.c.iap is None:
            return session, None
        operator = self.c.iap.operator(request)  # every request: IAP's assertion is the identity
        if session is not None and session.operator == operator and session.via == "iap":
            return session, None
        session, cookie = self.c.sessions.issue(operator, "iap")
        return session, cookie

    def _set_cookie(self, request: Request, response: Response, cookie: str) -> None:
        response.set_cookie(SESSION_COOKIE, cookie, max_age=self.c.settings.console.session_ttl_s, httponly=True,
                            samesite="strict", secure=auth.secure_request(request) or self.c.iap is not None,
                            path="/")

    def _refusal(self, request: Request, refused: Refused, session: Session | None) -> Response:
        response = self._render(request, "refused.html", session, status=refused.status,
                                error={"code": refused.code, "message": refused.message})
        if refused.retry_after_s is not None:
            response.headers["Retry-After"] = str(refused.retry_after_s)
        return response

    def _render(self, request: Request, template: str, session: Session | None, *, status: int = 200,
                **context: Any) -> HTMLResponse:
        notice = NOTICES.get(request.query_params.get("notice", ""))
        return self.c.templates.TemplateResponse(
            request, template,
            {"session": session, "csrf_field": CSRF_FIELD, "notice": notice, "local": self.c.iap is None,
             "max_reason_chars": self.c.limits.max_reason_chars, **context},
            status_code=status,
        )

    async def healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok")

    async def login_page(self, request: Request) -> Response:
        if self.c.iap is not None:
            return RedirectResponse("/", status_code=303)
        return self._render(request, "login.html", None)

    async def login(self, request: Request) -> Response:
        if self.c.iap is not None:
            return RedirectResponse("/", status_code=303)
        address = request.client.host if request.client else "-"
        try:
            auth.check_same_origin(request, self.c.origins)
            self.c.logins.check(address)  # before the secret is compared: a throttled guess learns nothing
            form = await read_form(request, self.c.settings.console.max_form_bytes)
        except Refused as refused:
            if refused.code == "login_throttled":
                response = self._render(request, "login.html", None, status=429,
                                        error={"code": refused.code, "message": refused.message})
                response.headers["Retry-After"] = str(refused.retry_after_s)
                return response
            return self._refusal(request, refused, None)
        if not auth.check_operator_secret(self.c.settings.console, form.get("secret")):
            self.c.logins.failed(address)
            return self._render(request, "login.html", None, status=401,
                                error={"code": "login_refused",
                                       "message": "That is not the operator secret (SPECIALISTS_CONSOLE_OPERATOR_SECRET; "
                                                  "on one machine it is in the local secrets file `specialists serve` "
                                                  "printed)."})
        _, cookie = await run_in_threadpool(self.c.sessions.issue, auth.local_operator(self.c.settings.console),
                                            "local")
        response = RedirectResponse("/customers", status_code=303)
        self._set_cookie(request, response, cookie)
        return response

    def logout(self, request: Request, session: Session, form: Form) -> Response:
        self.c.sessions.end(session)  # every copy of the cookie stops working, not only the browser's
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    def home(self, request: Request, session: Session) -> Response:
        return RedirectResponse("/customers", status_code=303)

    # --- customers ---------------------------------------------------------------------------------------

    def customers(self, request: Request, session: Session, *, error: dict | None = None,
                        status: int = 200) -> Response:
        after = request.query_params.get("after") or None
        search = request.query_params.get("q", "").strip()
        customers: tuple = ()
        next_after = None
        try:
            _check_id(after, "after=")
            if search and not re.fullmatch(r"[a-z0-9_.\-]{1,63}", search):
                raise Refused("search for part of a customer id: 1-63 of a-z, 0-9, _ . -", code="search_invalid",
                              status=400)
            page = self.c.ledger.customers(after=after, contains=search)
            customers, next_after = page.customers, page.next_after
        except (LedgerError, Refused) as refused:
            error, status = error or _error(refused), 400
        more = urlencode({"after": next_after, **({"q": search} if search else {})}) if next_after else None
        return self._render(request, "customers.html", session, status=status, customers=customers,
                            next_after=more, error=error, search=search)

    def add_customer(self, request: Request, session: Session, form: Form) -> Response:
        customer_id = form.get("customer_id")
        try:
            max_parallel = form.optional_integer("max_parallel", "max parallel")
            result = self.c.ledger.open_account(customer_id, operator=session.operator, max_parallel=max_parallel,
                                                reason=form.get("reason"))
        except (LedgerError, Refused) as refused:
            return self.customers(request, session, error=_error(refused), status=_status(refused))
        notice = "added" if result.outcome == "created" else "exists"  # as `specialists customers add` says it
        return RedirectResponse(f"/customers/{result.customer_id}?notice={notice}", status_code=303)

    def _customer_view(self, customer_id: str) -> dict[str, Any]:
        from taskstate import reads as task_reads

        summary = self.c.ledger.customer(customer_id)
        account = self.c.ledger.account(customer_id)
        with self.c.engine.connect() as conn:
            tasks = task_reads.customer_tasks(conn, customer_id, limit=CUSTOMER_TASKS)
        return {
            "customer_id": customer_id,
            "summary": summary,
            "account": account,
            "entitlements": [
                asdict(e) | {"skill_name": self.c.catalogue.skill_of(e.skill)} for e in (account.entitlements if account else ())
            ],
            "keys": keys.list_keys(self.c.engine, customer_id),
            "tasks": tasks,
            "skills": list(self.c.catalogue.specialist_by_skill),
            "max_reason_chars": self.c.limits.max_reason_chars,
        }

    def customer(self, request: Request, session: Session, customer_id: str = "", *,
                       error: dict | None = None, status: int = 200, issued: dict | None = None) -> Response:
        customer_id = customer_id or request.path_params["customer_id"]
        try:
            _check_id(customer_id, "a customer id")
            view = self._customer_view(customer_id)
        except (LedgerError, Refused) as missing:
            return self._render(request, "refused.html", session, status=404, error=_error(missing))
        sealed = request.cookies.get(ISSUED_COOKIE)
        if issued is None and sealed:
            shown = self.c.sessions.unseal(sealed, max_age_s=ISSUED_COOKIE_S)
            if shown is not None and shown.get("op") == session.operator:
                issued = shown | {"expires_at": datetime.fromisoformat(shown["expires_at"])}
        response = self._render(request, "customer.html", session, status=status, error=error, issued=issued, **view)
        if sealed:
            response.delete_cookie(ISSUED_COOKIE, path=f"/customers/{customer_id}")  # shown once
        return response

    def grant(self, request: Request, session: Session, form: Form) -> Response:
        customer_id = request.path_params["customer_id"]
        try:
            specialists = [self.c.catalogue.specialist_of(skill) for skill in form.all("skill")]
            days = form.optional_integer("expires_in_days", "expires in (days)")
            self.c.ledger.grant(
                customer_id, form.integer("credits", "credits"), operator=session.operator, skills=specialists,
                expires_in=timedelta(days=days) if days is not None else None,
                max_parallel=form.optional_integer("max_parallel", "max parallel"),
                priority=form.optional_integer("priority", "priority"),
                reason=form.get("reason"), require_customer=True,
                idempotency_key=form.get("idempotency_key") or None,
            )
        except (LedgerError, SkillUnknown, Refused) as refused:
            return self.customer(request, session, customer_id, error=_error(refused), status=_status(refused))
        return RedirectResponse(f"/customers/{customer_id}?notice=granted", status_code=303)

    def adjust(self, request: Request, session: Session, form: Form) -> Response:
        customer_id = request.path_params["customer_id"]
        try:
            self.c.ledger.require_customer(customer_id)
            self.c.ledger.adjust(customer_id, form.integer("credits", "credits"), form.get("reason"), session.operator)
        except (LedgerError, Refused) as refused:
            return self.customer(request, session, customer_id, error=_error(refused), status=_status(refused))
        return RedirectResponse(f"/customers/{customer_id}?notice=adjusted", status_code=303)

    def issue_key(self, request: Request, session: Session, form: Form) -> Response:
        customer_id = request.path_params["customer_id"]
        try:
            ttl_days = form.optional_integer("ttl_days", "lifetime (days)") or self.c.settings.keys.default_ttl_days
            if not 1 <= ttl_days <= 3650:
                raise Refused("the key's lifetime must be between 1 and 3650 days", code="ttl_invalid", status=400)
            issued = keys.issue_key(
                self.c.engine, _signer(self.c.settings), customer_id=customer_id, tier=form.get("tier") or "standard",
                ttl=timedelta(days=ttl_days), label=form.get("label"), require_customer=True,
                operator=session.operator,
            )
        except (ServiceError, Refused) as refused:
            return self.customer(request, session, customer_id, error=_error(refused), status=_status(refused))
        # Post/redirect/get, so a reload never issues a second key. The key rides to the next page once in a
        # signed cookie for that page only (HttpOnly, SameSite=Strict, ISSUED_COOKIE_S), which that page deletes:
        # never stored on the server, never in a URL, and the pages are not cached (no-store).
        target = f"/customers/{customer_id}"
        response = RedirectResponse(target, status_code=303)
        value = self.c.sessions.seal({"key_id": issued.identity.key_id, "token": issued.token,
                                      "expires_at": issued.identity.expires_at.isoformat(), "op": session.operator})
        response.set_cookie(ISSUED_COOKIE, value, max_age=ISSUED_COOKIE_S, httponly=True, samesite="strict",
                            secure=auth.secure_request(request) or self.c.iap is not None, path=target)
        return response

    def revoke_key(self, request: Request, session: Session, form: Form) -> Response:
        key_id = request.path_params["key_id"]
        customer_id = form.get("customer_id")
        try:
            _check_id(key_id, "a key id")
            keys.revoke_key(self.c.engine, key_id, reason=form.get("reason"), operator=session.operator,
                            limits=self.c.limits)
        except (ServiceError, Refused) as refused:
            if customer_id:
                return self.customer(request, session, customer_id, error=_error(refused), status=_status(refused))
            raise Refused(refused.message, code=refused.code, status=_status(refused)) from None
        target = f"/customers/{customer_id}" if customer_id else "/customers"
        return RedirectResponse(f"{target}?notice=revoked", status_code=303)

    # --- reservations and reconcile ----------------------------------------------------------------------

    def _reservations_view(self) -> dict[str, Any]:
        from taskstate import claims, outbox
        from workers.assembly import USAGE
        from workers.reconcile import rule_charges, unknown_free_tasks

        unknown = [asdict(r) for r in self.c.ledger.reservation_page(states=("unknown",)).reservations]
        unknown += unknown_free_tasks(self.c.engine, customer_id=None, limit=self.c.limits.max_rows_per_listing)
        opened = [asdict(r) for r in self.c.ledger.reservation_page(states=("open",)).reservations]
        with self.c.engine.connect() as conn:
            now = conn.exec_driver_sql("SELECT now()").scalar_one()
            evidence = claims.tasks_claims(conn, [row["job_id"] for row in unknown + opened])  # one statement
            for row in unknown + opened:
                row["age"] = _age(row["created_at"], now)
                row["jobs"] = evidence[row["job_id"]]
                row["worker"] = ", ".join(sorted({j["worker_id"] for j in row["jobs"] if j["worker_id"]})) or "-"
                row["skill_name"] = self.c.catalogue.skill_of(row["skill"]) or row["skill"]
            for row in unknown:  # what an operator decides from: the rule's charge per outcome, the trace, the logs
                job_ids = [j["job_id"] for j in row["jobs"]]
                row["rule"] = rule_charges(conn, row["job_id"], job_ids, USAGE)
                parent = outbox.trace_parent_of(conn, job_ids[-1]) if job_ids else None
                row["trace_id"] = parent.split("-")[1] if parent and parent.count("-") == 3 else None
                row["log_query"] = f'jsonPayload.task_id="{row["job_id"]}"'
                row["usage_query"] = urlencode({"customer": row["customer_id"],
                                                "since": _day(row["created_at"]), "until": _day(now)})
        return {"unknown": unknown, "open": opened, "states": RECONCILE_STATES,
                "trace_project": self.c.settings.telemetry.project}

    def reservations(self, request: Request, session: Session, *, error: dict | None = None,
                           status: int = 200) -> Response:
        return self._render(request, "reservations.html", session, status=status, error=error,
                            **self._reservations_view())

    def reconcile(self, request: Request, session: Session, form: Form) -> Response:
        """Two steps: the first shows what will happen and asks to confirm; the second (``confirm=yes``) does it."""
        from workers.assembly import USAGE
        from workers.reconcile import ReconcileRefused, reconcile

        job_id = request.path_params["job_id"]
        try:
            _check_id(job_id, "a job id")
            reserved = self.c.ledger.reservation(job_id)
            if reserved is None:
                from workers.reconcile import rule_charges

                with self.c.engine.connect() as conn:  # a free specialist's task reserves nothing, yet is one
                    if rule_charges(conn, job_id, [], USAGE) is None:
                        raise Refused(f"no reservation or task has the id {job_id}", code="job_not_found",
                                      status=404)
            credits = reserved.credits if reserved is not None else 0
            kind = form.get("kind")
            if kind == "charged":
                charged = credits
            elif kind == "void":
                charged = 0
            elif kind == "rule":  # the service's own rule for the outcome chosen below
                from workers.reconcile import rule_charges

                with self.c.engine.connect() as conn:
                    rule = rule_charges(conn, job_id, [j["job_id"] for j in claims_of(conn, job_id)], USAGE)
                if rule is None or form.get("state") not in rule:
                    raise Refused("the rule's charge needs an A2A task and how it ended; choose charged, void or "
                                  "partial", code="kind_required", status=400)
                charged = rule[form.get("state")]
            elif kind == "partial":
                charged = form.integer("charged", "credits to charge")
                if not 0 <= charged <= credits:
                    raise Refused(f"a partial charge is between 0 and the {credits} credits reserved",
                                  code="charge_invalid", status=400)
            else:
                raise Refused("choose the rule's charge, charged, void or partial", code="kind_required", status=400)
            state = form.get("state")
            if state not in RECONCILE_STATES:
                raise Refused(f"choose how the task ended: {', '.join(RECONCILE_STATES)}", code="state_required",
                              status=400)
            reason = form.get("reason")
            if not reason:
                raise Refused("a reconcile needs a reason: what you established, and how", code="reason_required",
                              status=400)
            if form.get("confirm") != "yes":
                from workers.reconcile import rule_charges

                with self.c.engine.connect() as conn:
                    rule = rule_charges(conn, job_id, [j["job_id"] for j in claims_of(conn, job_id)], USAGE)
                return self._render(request, "reconcile_confirm.html", session, job_id=job_id, reserved=reserved,
                                    credits=credits, kind=kind, charged=charged, state=state, reason=reason,
                                    rule_credits=None if rule is None else rule[state])
            result = reconcile(self.c.engine, job_id, charged=charged, state=state, reason=reason,
                               operator=session.operator, usage=USAGE, limits=self.c.limits)
        except (LedgerError, ReconcileRefused, Refused) as refused:
            error = _error(refused)
            if error["code"] in ALREADY_RESOLVED:
                error["title"] = "Already resolved"
            return self.reservations(request, session, error=error, status=_status(refused))
        if result.ledger is not None and result.ledger.outcome == "exists":
            return self.reservations(request, session, status=409, error={
                "title": "Already resolved", "code": "already_resolved",
                "message": f"{job_id} was already reconciled by another operator with the same charge; "
                           "nothing changed."})
        return RedirectResponse("/reservations?notice=reconciled", status_code=303)

    # --- usage -------------------------------------------------------------------------------------------

    def _period(self, request: Request) -> tuple[datetime, datetime, str | None]:
        today = datetime.now(timezone.utc).date()
        try:
            until_day = date.fromisoformat(request.query_params.get("until") or today.isoformat())
            since_day = date.fromisoformat(request.query_params.get("since")
                                           or (until_day - timedelta(days=USAGE_DEFAULT_DAYS - 1)).isoformat())
        except ValueError:
            raise Refused("dates are YYYY-MM-DD", code="period_invalid", status=400) from None
        days = (until_day - since_day).days + 1
        longest = min(self.c.settings.console.max_usage_days, self.c.limits.max_usage_days)
        if days < 1 or days > longest:
            raise Refused(f"a period is 1 to {longest} days (SPECIALISTS_CONSOLE_MAX_USAGE_DAYS, "
                          "SPECIALISTS_LEDGER_MAX_USAGE_DAYS)", code="period_invalid", status=400)
        customer = request.query_params.get("customer") or None
        _check_id(customer, "customer=")
        since = datetime.combine(since_day, datetime.min.time(), timezone.utc)
        until = datetime.combine(until_day + timedelta(days=1), datetime.min.time(), timezone.utc)
        return since, until, customer

    def _usage_data(self, since: datetime, until: datetime, customer: str | None) -> dict[str, Any]:
        from taskstate import reads as task_reads
        from workers.hosted_rlm import journal

        credits = [asdict(r) for r in self.c.ledger.usage(since=since, until=until, customer_id=customer)]
        with self.c.engine.connect() as conn:
            outcomes = task_reads.tasks_by_outcome(conn, since=since, until=until, customer_id=customer)
            jobs = journal.usage_by_job(conn, since=since, until=until, limit=JOBS_LISTED)
        return {"credits": credits, "outcomes": outcomes, "jobs": jobs}

    def usage(self, request: Request, session: Session) -> Response:
        try:
            since, until, customer = self._period(request)
            data = self._usage_data(since, until, customer)
        except (LedgerError, Refused) as refused:  # an unknown or malformed customer, a wrong period: the form
            params = request.query_params
            return self._render(request, "usage.html", session, status=400, error=_error(refused),
                                since=params.get("since", ""), until=params.get("until", ""),
                                customer=params.get("customer", ""))
        days = [(since + timedelta(days=i)).date() for i in range((until - since).days)]
        by_specialist: dict[str, dict[date, int]] = {}
        by_customer: dict[str, int] = {}
        by_customer_day: dict[str, dict[date, int]] = {}
        for row in data["credits"]:
            by_specialist.setdefault(row["specialist_id"], {}).setdefault(row["day"], 0)
            by_specialist[row["specialist_id"]][row["day"]] += row["credits_charged"]
            by_customer[row["customer_id"]] = by_customer.get(row["customer_id"], 0) + row["credits_charged"]
            by_customer_day.setdefault(row["customer_id"], {}).setdefault(row["day"], 0)
            by_customer_day[row["customer_id"]][row["day"]] += row["credits_charged"]
        # The chart by customer shows the CHART_CUSTOMERS largest, the rest as one series (the table lists all).
        largest = [c for c, _ in sorted(by_customer.items(), key=lambda kv: (-kv[1], kv[0]))[:CHART_CUSTOMERS]]
        others: dict[date, int] = {}
        for customer_id, days_of in by_customer_day.items():
            if customer_id not in largest:
                for day, credits in days_of.items():
                    others[day] = others.get(day, 0) + credits
        customer_series = {c: by_customer_day[c] for c in largest} | ({"(others)": others} if others else {})
        by_state: dict[str, dict[date, int]] = {}
        for row in data["outcomes"]:
            by_state.setdefault(row["state"], {}).setdefault(row["day"], 0)
            by_state[row["state"]][row["day"]] += row["tasks"]
        query = {"since": since.date().isoformat(), "until": (until - timedelta(days=1)).date().isoformat()}
        if customer:
            query["customer"] = customer
        return self._render(
            request, "usage.html", session, since=query["since"], until=query["until"], customer=customer or "",
            credits_chart=charts.stacked_bars(days, by_specialist, title="Credits charged per day, by specialist"),
            customers_chart=charts.stacked_bars(days, customer_series, title="Credits charged per day, by customer"),
            outcomes_chart=charts.stacked_bars(days, by_state, title="Tasks admitted per day, by outcome"),
            by_customer=sorted(by_customer.items(), key=lambda kv: (-kv[1], kv[0])), jobs=data["jobs"],
            credits_rows=data["credits"], csv_query=urlencode(query),
        )

    def usage_csv(self, request: Request, session: Session) -> Response:
        since, until, customer = self._period(request)
        what = request.query_params.get("what", "credits")
        try:
            data = self._usage_data(since, until, customer)
        except LedgerError as refused:
            raise Refused(refused.message, code=refused.code, status=400) from None
        columns = {
            "credits": ["day", "specialist_id", "customer_id", "credits_charged", "settlements"],
            "outcomes": ["day", "specialist_id", "state", "tasks"],
            "jobs": ["job_id", "specialist_id", "state", "outcome", "model_calls", "prompt_tokens",
                     "completion_tokens", "cost_usd", "calls_with_unknown_cost", "cpu_seconds", "charged_credits",
                     "started_at"],
        }.get(what)
        if columns is None:
            raise Refused("what= is credits, outcomes or jobs", code="csv_invalid", status=400)
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(data[what])
        name = f"{what}-{since.date()}-{(until - timedelta(days=1)).date()}.csv"
        return Response(out.getvalue(), media_type="text/csv; charset=utf-8",
                        headers={"Content-Disposition": f'attachment; filename="{name}"'})

    # --- health and journal ------------------------------------------------------------------------------

    def health(self, request: Request, session: Session) -> Response:
        from ops.health import health
        from taskstate import push

        found = health(self.c.settings, self.c.engine)
        with self.c.engine.connect() as conn:  # the same reads as `specialists push failures` and `push retries`
            failed = push.failed_deliveries(conn, limit=PUSH_FAILURES_LISTED)
            retrying = push.retrying_deliveries(conn, limit=PUSH_FAILURES_LISTED)
        return self._render(request, "health.html", session, health=found, push_failures=failed,
                            push_retries=retrying, push_on=self.c.settings.push.enabled)

    def journal(self, request: Request, session: Session) -> Response:
        params = request.query_params
        customer = params.get("customer") or None
        operator = params.get("operator") or None
        kinds = tuple(k for k in params.getlist("kind") if k)
        before = params.get("before")
        error = None
        page = None
        try:
            if any(k not in JOURNAL_KINDS for k in kinds):
                raise Refused(f"kinds are {', '.join(JOURNAL_KINDS)}", code="kind_invalid", status=400)
            if before is not None and not (before.isdigit() and len(before) <= 18):
                raise Refused("before= is a posting id", code="cursor_invalid", status=400)
            _check_id(customer, "customer=")
            _check_id(operator, "operator=")
            page = self.c.ledger.journal(customer_id=customer, operator=operator, kinds=kinds or None,
                                         before=int(before) if before else None, limit=JOURNAL_PAGE)
        except (LedgerError, Refused) as refused:
            error = _error(refused)
        verified = None
        if params.get("verify") == "1" and error is None:
            audit = self.c.ledger.audit(customer)
            verified = {"violations": audit.violations, "totals": audit.totals, "customers": audit.customers,
                        "customer": customer}
        keep = {k: v for k, v in (("customer", customer), ("operator", operator)) if v}
        older = None
        if page is not None and page.next_before is not None:
            older = urlencode([*keep.items(), *(("kind", k) for k in kinds), ("before", page.next_before)])
        return self._render(request, "journal.html", session, status=_status_of(error), error=error,
                            lines=page.lines if page else (), kinds=JOURNAL_KINDS, chosen=kinds,
                            customer=customer or "", operator=operator or "", older=older, verified=verified,
                            verify_query=urlencode([*keep.items(), ("verify", "1")]))


def _check_id(value: str | None, what: str) -> None:
    """Refuse (400) an id that no row can have before it reaches a statement (a NUL byte would be a database
    error, a megabyte a slow one)."""
    if value is not None and not ID_TEXT.fullmatch(value):
        raise Refused(f"{what} is not an id: 1-200 printable characters, no spaces", code="id_invalid", status=400)


def _day(at: datetime) -> str:
    return at.astimezone(timezone.utc).date().isoformat()


def claims_of(conn: Any, task_id: str) -> list[dict[str, Any]]:
    from taskstate import claims

    return claims.task_claims(conn, task_id)


def _signer(settings: Settings) -> keys.KeySigner:
    return keys.KeySigner([s.get_secret_value() for s in settings.keys.signing_secrets], settings.keys.environment)


def _error(problem: Exception) -> dict[str, str]:
    return {"code": getattr(problem, "code", "refused"), "message": getattr(problem, "message", str(problem))}


def _status(problem: Exception) -> int:
    if isinstance(problem, Refused):
        return problem.status
    if isinstance(problem, SkillUnknown):
        return 400
    return 409


def _status_of(error: dict | None) -> int:
    return 200 if error is None else 400
