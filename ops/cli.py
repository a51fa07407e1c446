"""The `specialists` operator command: database, keys, credits, reservations, the ledger, the service
(`serve` the whole service on one machine, or its parts: `worker`, `dispatcher`).

Every subcommand prints a table for people and accepts ``--json`` for scripts;
exit codes are listed in ``ops.output``.
"""

from __future__ import annotations

import argparse
import getpass
import os
import signal
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property

from pydantic import ValidationError
from sqlalchemy import Engine

from core import db, settings_names
from core.errors import ServiceError
from core.settings import Settings, describe_invalid
from core.specs import SpecInvalid
from ledger import keys
from ledger.client import Ledger
from ledger.errors import CustomerNotFound, LedgerInputInvalid
from ledger.near import did_you_mean, near_customer_ids, near_key_ids
from ops import local_secrets, output
from ops.flags import GlobalFlags, JsonFlag, OperatorFlag, Parser, UsageError
from ops.output import EXIT_CONFIG, EXIT_DATABASE, EXIT_OK, EXIT_REFUSED, EXIT_USAGE, emit, fail, say
from ops.topology import READY_FD, Ready, Role, RoleFailed, StartBounds, ops_cli, stop


@dataclass
class Ctx:
    """What a subcommand needs: settings, the database (opened on first use), output mode."""

    settings: Settings
    as_json: bool
    operator: str
    generated_secrets: list[str] = field(default_factory=list)
    _engine: Engine | None = field(default=None, init=False)

    @cached_property
    def url(self) -> str:
        return db.database_url(self.settings)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = db.make_engine(self.url, self.settings)
        return self._engine

    def engine_at_head(self) -> Engine:
        db.require_schema_at_head(self.engine)
        return self.engine

    def signer(self) -> keys.KeySigner:
        return keys.KeySigner(
            [s.get_secret_value() for s in self.settings.keys.signing_secrets], self.settings.keys.environment
        )


# --- db ---------------------------------------------------------------------


def cmd_db_upgrade(ctx: Ctx, args: argparse.Namespace) -> int:
    before = _current_or_none(ctx)
    db.upgrade(ctx.url)
    after = db.current_revision(ctx.engine)
    emit(
        {"database": db.redact_url(ctx.url), "from": before, "to": after, "head": db.head_revision()},
        as_json=ctx.as_json,
        title="schema upgraded" if before != after else "schema already at head",
    )
    return EXIT_OK


def cmd_db_status(ctx: Ctx, args: argparse.Namespace) -> int:
    current = _current_or_none(ctx)
    head = db.head_revision()
    emit(
        {"database": db.redact_url(ctx.url), "current": current, "head": head, "at_head": current == head},
        as_json=ctx.as_json,
        title="schema",
    )
    return EXIT_OK if current == head else EXIT_DATABASE


def cmd_db_stop(ctx: Ctx, args: argparse.Namespace) -> int:
    """Stop this machine's embedded PostgreSQL, which outlives `serve` on purpose (the next command reuses it)."""
    if not ctx.settings.database.embedded:
        return fail("db_not_embedded", "DATABASE_URL is set: `db stop` stops only the embedded PostgreSQL of "
                    "SPECIALISTS_DATA_DIR; stop that server where it runs", as_json=ctx.as_json, exit_code=EXIT_CONFIG)
    folder = ctx.settings.database.data_dir / "postgres"
    pid = db.stop_embedded_postgres(ctx.settings.database.data_dir)
    emit({"data_dir": str(folder), "stopped": pid is not None, "pid": pid}, as_json=ctx.as_json,
         title="embedded PostgreSQL stopped (its data kept)" if pid is not None else "embedded PostgreSQL was not running")
    return EXIT_OK


def _current_or_none(ctx: Ctx) -> str | None:
    with db.reaching_the_database(ctx.url):
        return db.current_revision(ctx.engine)


# --- keys -------------------------------------------------------------------

_KEY_COLUMNS = ["key_id", "customer_id", "environment", "key_form", "tier", "label", "issued_at", "issued_by",
                "expires_at", "revoked_at", "revoked_by"]


def cmd_keys_issue(ctx: Ctx, args: argparse.Namespace) -> int:
    ttl_days = args.ttl_days if args.ttl_days is not None else ctx.settings.keys.default_ttl_days
    if not 1 <= ttl_days <= 3650:
        return fail("ttl_invalid", "--ttl-days must be between 1 and 3650", as_json=ctx.as_json)
    issued = keys.issue_key(
        ctx.engine_at_head(),
        ctx.signer(),
        customer_id=args.customer,
        tier=args.tier,
        ttl=timedelta(days=ttl_days),
        label=args.label,
        require_customer=True,  # creating a customer is `customers add`: a mistyped id gets no key
        operator=ctx.operator,
    )
    record = {
        "key_id": issued.identity.key_id,
        "customer_id": issued.identity.customer_id,
        "tier": issued.identity.tier,
        "environment": issued.identity.environment,
        "key_form": issued.identity.form,
        "issued_at": issued.identity.issued_at,
        "issued_by": ctx.operator,
        "expires_at": issued.identity.expires_at,
        "key": issued.token,
    }
    if ctx.as_json:
        output.emit_json(record)
    elif not output.stdout_is_a_terminal():
        # `keys issue > key.txt`: the file holds the key alone, as `keys verify < key.txt` reads it; the record
        # (its key_id for `keys revoke`) goes to the person on stderr.
        emit({k: v for k, v in record.items() if k != "key"}, as_json=False, title="key issued", on_stderr=True)
        output.progress("The key is shown once and is not stored: it is on standard output alone.")
        print(issued.token)
    else:
        emit({k: v for k, v in record.items() if k != "key"}, as_json=False, title="key issued")
        say("The key is shown once and is not stored; hand it to the customer now:")
        print(issued.token)
    return EXIT_OK


def cmd_keys_list(ctx: Ctx, args: argparse.Namespace) -> int:
    if args.customer is not None:
        Ledger(ctx.engine_at_head(), ctx.settings.ledger).require_customer(args.customer)
    rows = keys.list_keys(ctx.engine_at_head(), args.customer)
    emit(rows, as_json=ctx.as_json, columns=_KEY_COLUMNS, title="keys")
    return EXIT_OK


def cmd_keys_revoke(ctx: Ctx, args: argparse.Namespace) -> int:
    changed = keys.revoke_key(
        ctx.engine_at_head(), args.key_id, reason=args.reason, operator=ctx.operator, limits=ctx.settings.ledger
    )
    emit(
        {
            "key_id": args.key_id,
            "revoked": True,
            "already_revoked": not changed,
            "effective_within_s": ctx.settings.keys.revocation_cache_s,
        },
        as_json=ctx.as_json,
        title="key revoked" if changed else "key was already revoked",
    )
    return EXIT_OK


def cmd_keys_verify(ctx: Ctx, args: argparse.Namespace) -> int:
    presented = sys.stdin.readline(keys.MAX_KEY_CHARS + 2).strip()
    if not presented:
        return fail("key_missing", "pipe the key on standard input: `specialists keys verify < key.txt`", as_json=ctx.as_json)
    verifier = keys.KeyVerifier(ctx.signer(), ctx.engine_at_head(), revocation_cache_s=0)
    try:
        identity = verifier.verify(presented)
    except keys.KeyRefused as refused:
        if ctx.as_json:
            output.emit_json({"valid": False, "reason": refused.code, "message": refused.message})
            return EXIT_REFUSED
        return fail(refused.code, refused.message, as_json=False)
    emit(
        {
            "valid": True,
            "key_id": identity.key_id,
            "customer_id": identity.customer_id,
            "tier": identity.tier,
            "environment": identity.environment,
            "key_form": identity.form,
            "expires_at": identity.expires_at,
        },
        as_json=ctx.as_json,
        title="key is valid",
    )
    return EXIT_OK


# --- serve, worker, dispatcher ---------------------------------------------

class _Stopping:
    """SIGINT/SIGTERM while `serve` runs: remembered, so that shutdown stops the children before exiting.

    uvicorn re-raises the signal it handled once it stops; with these handlers in place that
    ends here instead of killing the process before its children are stopped."""

    def __init__(self) -> None:
        self.signal: int | None = None
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.signal = signum


def _die_with_parent() -> None:
    """In a child of `serve`: get SIGTERM when `serve` dies, even by SIGKILL (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child_env(settings: Settings, url: str, **extra: str) -> dict[str, str]:
    """A child's environment: this one, plus what `serve` resolved (the database, local secrets)."""
    env = dict(os.environ)
    env["DATABASE_URL"] = url
    for name, variable in local_secrets.GENERATED.items():
        value = local_secrets.current(settings, name)
        values = [secret.get_secret_value() for secret in (value if isinstance(value, list) else [value] if value else [])]
        if values:
            env[variable] = ",".join(values)
    env.update(extra)
    return env


def _child_preexec() -> None:
    """In a child of `serve`, before it runs: it dies with `serve`, and it ignores SIGINT until its command
    installs its own handler. Ctrl-C reaches the whole process group, and a child still loading its modules
    would end in a KeyboardInterrupt traceback; `serve` stops its children itself, with SIGTERM."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # kept across exec, and Python keeps an ignored SIGINT ignored


def _assign(settings: Settings, section: str, name: str, value: object) -> None:
    """Set one field of a section, validated as its environment variable would be."""
    part = getattr(settings, section)
    part.__pydantic_validator__.validate_assignment(part, name, value)


def _config_problem(problem: ServiceError, as_json: bool) -> int:
    return fail(problem.code, problem.message, as_json=as_json, exit_code=EXIT_CONFIG)


def cmd_serve(ctx: Ctx, args: argparse.Namespace) -> int:
    """The whole service on this machine: the A2A edge here, and a worker, a dispatcher and the operator console as
    child processes (SPECIALISTS_SERVE_WORKER, _DISPATCHER, _CONSOLE). Ctrl-C stops them all, at any moment."""
    stopping = _Stopping()  # first: a Ctrl-C during start-up is remembered, and start-up stops at the next step
    from workers.dispatch.process import DispatcherNotConfigured, check_dispatcher_settings
    from app.assembly import EdgeNotConfigured, check_edge_settings
    from workers.assembly import WorkerNotConfigured, check_worker_settings

    settings = ctx.settings.model_copy(deep=True)
    for section, name, value in (("edge", "host", args.host), ("edge", "port", args.port), ("worker", "port", args.worker_port),
                                 ("edge", "grpc_port", args.grpc_port)):
        if value is not None:  # validated like the environment variable would be
            _assign(settings, section, name, value)
    if settings.serve.console is None:  # one machine: the console too; production runs it as its own service
        _assign(settings, "serve", "console", settings.database.embedded)
    child_settings: dict[str, str] = {}
    if settings.database.embedded:
        # The children get the embedded database's URL (DATABASE_URL), but they run on this one machine too.
        child_settings["SPECIALISTS_MODEL_ROUTES_ALLOW_SCRIPTED"] = "true"
    if settings.serve.worker and settings.dispatch.backend == "embedded":
        # One machine: its own dispatcher sends no OIDC token; the signed body is the worker's check.
        _assign(settings, "worker", "oidc_verify", False)
        child_settings["SPECIALISTS_WORKER_OIDC_VERIFY"] = "false"
    from core.specs import load_specs

    specs = load_specs(settings.hosted.specs_dir)  # an invalid spec stops here, naming the file and field
    try:
        needed = ["key_signing_secrets"]
        if settings.serve.worker or settings.serve.dispatcher:
            needed.append("worker_job_secrets")
        if settings.serve.worker and any(loaded.spec.executor == "rlm" for loaded in specs.values()):
            needed.append("specialist_checkpoint_key")  # its rlm specialists sign their checkpoints
        if settings.serve.console:
            needed.append("console_session_secrets")
            if settings.console.auth == "local":
                needed.append("console_operator_secret")
        local_secrets.require(settings, needed)  # every missing one named at once
        check_edge_settings(settings)
        if settings.serve.worker:
            check_worker_settings(settings)
        if settings.serve.dispatcher:
            check_dispatcher_settings(settings)
    except (local_secrets.SecretMissing, EdgeNotConfigured, WorkerNotConfigured, DispatcherNotConfigured) as problem:
        return _config_problem(problem, ctx.as_json)
    if settings.database.embedded:
        # The embedded database belongs to this machine's service: bring it to head.
        db.upgrade(ctx.url)
    db.require_schema_at_head(ctx.engine)
    from app.server import serve  # the web stack loads only for this command
    from workers.hosted_rlm.serving import check_readiness

    # A route whose key is missing is reported now (and by the worker's /readyz), not by a customer's task.
    not_ready = check_readiness(settings) if settings.serve.worker else []
    worker_url = f"http://{settings.worker.host}:{settings.worker.port}"
    dispatch_to = f"{worker_url}/jobs" if settings.serve.worker else settings.dispatch.worker_url
    emit(
        {
            "database": db.redact_url(ctx.url),
            "embedded": settings.database.embedded,
            "schema": db.current_revision(ctx.engine),
            "specialists": ", ".join(sorted(specs)),
            "not ready": "; ".join(f"{p.specialist_id}: {p.message}" for p in not_ready) if not_ready else "none",
            "url": settings.edge.url,
            "grpc": f"{settings.edge.host}:{settings.edge.grpc_port}, cards name {settings.edge.grpc_url}"
            if settings.edge.grpc_port
            else f"not served here (SPECIALISTS_GRPC_PORT); cards name {settings.edge.grpc_url or 'none'}",
            "worker": worker_url if settings.serve.worker else "not started here (SPECIALISTS_SERVE_WORKER)",
            "dispatcher": f"{settings.dispatch.backend} to {dispatch_to}"
            if settings.serve.dispatcher
            else "not started here (SPECIALISTS_SERVE_DISPATCHER)",
            "console": f"{_console_url(settings)} (log in with console_operator_secret from "
            f"{local_secrets.secrets_path(settings)})"
            if settings.serve.console and settings.console.auth == "local"
            else _console_url(settings) if settings.serve.console
            else "not started here (SPECIALISTS_SERVE_CONSOLE)",
            "local secrets": ", ".join(ctx.generated_secrets) + f" generated into {local_secrets.secrets_path(settings)}"
            if ctx.generated_secrets
            else "none generated",
        },
        as_json=ctx.as_json,
        title="service starting",
    )
    ctx.engine.dispose()
    return _run_children(settings, ctx, _children(settings, ctx.url, child_settings, dispatch_to), stopping, serve)


def _children(settings: Settings, url: str, child_settings: dict[str, str], dispatch_to: str | None) -> list[Role]:
    """The roles `serve` starts beside its edge (SPECIALISTS_SERVE_WORKER, _DISPATCHER, _CONSOLE)."""
    def child(name: str, command: list[str], ready: Ready, **extra: str) -> Role:
        return Role(name, ops_cli(*command), _child_env(settings, url, **extra), ready,
                    stop_grace_s=settings.worker.drain_s + settings.serve.child_stop_margin_s, preexec=_child_preexec)

    children = []
    if settings.serve.worker:
        children.append(child("worker", ["worker", "--host", settings.worker.host, "--port", str(settings.worker.port)],
                              Ready.http(f"http://{settings.worker.host}:{settings.worker.port}/healthz"),
                              **child_settings))
    if settings.serve.dispatcher:
        # Its ready byte comes once its loop can run; it delivers to a worker still starting as to one busy.
        children.append(child("dispatcher", ["dispatcher", "--ready-fd", READY_FD], Ready.pipe(),
                              SPECIALISTS_DISPATCH_WORKER_URL=dispatch_to or ""))
    if settings.serve.console:
        children.append(child("console", ["console", "--host", settings.console.host, "--port",
                                          str(settings.console.port)],
                              Ready.http(f"{_console_url(settings)}healthz"), **child_settings))
    return children


def _run_children(settings: Settings, ctx: Ctx, children: list[Role], stopping: _Stopping, serve) -> int:
    """Start the children side by side, wait until each is ready (while it makes progress: ops/topology.py), then
    serve the edge until stopped; the children are stopped however it ends. `serve` answers /readyz only once
    every part it starts is up."""
    started: list[Role] = []
    try:
        for role in children:
            if stopping.signal is None:
                started.append(role.start())
        for role in started:
            role.wait_ready(StartBounds.from_settings(settings), lambda: stopping.signal is not None)
        if stopping.signal is None:
            serve(settings, ctx.url)
    except RoleFailed as problem:
        return fail(problem.code, problem.message, as_json=ctx.as_json)
    finally:
        stop(started)
    return EXIT_OK


def _configure_logging(settings: Settings) -> None:
    from app.observability import configure_logging

    configure_logging(settings.log.level)


def cmd_worker(ctx: Ctx, args: argparse.Namespace) -> int:
    """Serve the private worker endpoint (POST /jobs) until stopped."""
    from workers.assembly import WorkerNotConfigured, run_worker

    settings = ctx.settings.model_copy(deep=True)
    for name, value in (("host", args.host), ("port", args.port)):
        if value is not None:
            _assign(settings, "worker", name, value)
    _configure_logging(settings)
    # uvicorn re-raises the signal it stopped on once it has stopped; with these handlers that ends here
    # (exit 0) instead of in a KeyboardInterrupt traceback or a kill by the default SIGTERM action. A signal
    # that comes while the worker still starts (before uvicorn handles its own) ends the start-up: nothing is
    # claimed yet. Swallowed, it left a worker serving on, killed only past its stopper's grace.
    listening: list[int] = []

    def on_stop_signal(_signum: int, _frame: object) -> None:
        if not listening:
            raise SystemExit(EXIT_OK)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_stop_signal)
    try:
        run_worker(settings, host=settings.worker.host, port=settings.worker.port, database_url=ctx.url,
                   on_listening=listening.append)
    except WorkerNotConfigured as problem:
        return _config_problem(problem, ctx.as_json)
    return EXIT_OK


def cmd_dispatcher(ctx: Ctx, args: argparse.Namespace) -> int:
    """Deliver the outbox to workers (embedded) or relay it to Cloud Tasks, and sweep expired leases."""
    from workers.dispatch.base import DispatchRefused
    from workers.dispatch.process import DispatcherNotConfigured, run_dispatcher

    _configure_logging(ctx.settings)
    on_ready = None
    if args.ready_fd is not None:  # `serve` waits for this byte before it answers /readyz

        def on_ready() -> None:
            os.write(args.ready_fd, b"1")
            os.close(args.ready_fd)

    try:
        run_dispatcher(ctx.settings, database_url=ctx.url, on_ready=on_ready)
    except (DispatcherNotConfigured, DispatchRefused) as problem:
        return _config_problem(problem, ctx.as_json)
    return EXIT_OK


def cmd_console(ctx: Ctx, args: argparse.Namespace) -> int:
    """Serve the operator console (ops/console) until stopped: SPECIALISTS_CONSOLE_HOST:SPECIALISTS_CONSOLE_PORT."""
    import uvicorn

    from ops.console.app import create_console
    from ops.console.auth import ConsoleNotConfigured, check_console_settings

    settings = ctx.settings.model_copy(deep=True)
    for name, value in (("host", args.host), ("port", args.port)):
        if value is not None:
            _assign(settings, "console", name, value)
    _configure_logging(settings)
    try:
        check_console_settings(settings.console)
        local_secrets.require(settings, ["key_signing_secrets"])  # the console issues customer keys
    except (ConsoleNotConfigured, local_secrets.SecretMissing) as problem:
        return _config_problem(problem, ctx.as_json)
    app = create_console(settings, ctx.engine_at_head())
    for signum in (signal.SIGINT, signal.SIGTERM):  # uvicorn's re-raised signal ends here, exit 0
        signal.signal(signum, lambda *_: None)
    say(f"console: http://{settings.console.host}:{settings.console.port}/ (auth {settings.console.auth})")
    uvicorn.Server(uvicorn.Config(app, host=settings.console.host, port=settings.console.port, log_level="warning",
                                  access_log=False, server_header=False)).run()
    return EXIT_OK


def _console_url(settings: Settings) -> str:
    return f"http://{settings.console.host}:{settings.console.port}/"


# --- wiring -----------------------------------------------------------------


def build_parser(flags: GlobalFlags | None = None) -> argparse.ArgumentParser:
    flags = flags or GlobalFlags()
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action=JsonFlag, flags=flags, help="print JSON for scripts instead of tables")
    common.add_argument("--operator", action=OperatorFlag, flags=flags,
                        help="who is acting, for audit records (default: OS user)")

    parser = Parser(prog="specialists", description=__doc__.splitlines()[0], parents=[common])
    groups = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")

    serve = groups.add_parser(
        "serve", parents=[common], help="run the service on this machine: the A2A edge, a dispatcher and a worker"
    )
    serve.add_argument("--host", default=None, help="default: SPECIALISTS_EDGE_HOST (127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="default: SPECIALISTS_EDGE_PORT (8080)")
    serve.add_argument("--worker-port", type=int, default=None, help="default: SPECIALISTS_WORKER_PORT (8081)")
    serve.add_argument(
        "--grpc-port", type=int, default=None, help="the A2A gRPC binding's port; default: SPECIALISTS_GRPC_PORT (0: off)"
    )
    serve.set_defaults(func=cmd_serve)

    worker = groups.add_parser("worker", parents=[common], help="serve the private worker endpoint")
    worker.add_argument("--host", default=None, help="default: SPECIALISTS_WORKER_HOST (127.0.0.1)")
    worker.add_argument("--port", type=int, default=None, help="default: SPECIALISTS_WORKER_PORT (8081)")
    worker.set_defaults(func=cmd_worker)

    dispatcher = groups.add_parser(
        "dispatcher", parents=[common], help="deliver admitted jobs to workers (embedded) or to Cloud Tasks"
    )
    dispatcher.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)  # for `serve`
    dispatcher.set_defaults(func=cmd_dispatcher)

    console = groups.add_parser("console", parents=[common], help="serve the operator console (a web page)")
    console.add_argument("--host", default=None, help="default: SPECIALISTS_CONSOLE_HOST (127.0.0.1)")
    console.add_argument("--port", type=int, default=None, help="default: SPECIALISTS_CONSOLE_PORT (8090)")
    console.set_defaults(func=cmd_console)

    dbp = groups.add_parser("db", parents=[common], help="database schema").add_subparsers(
        dest="action", required=True
    )
    dbp.add_parser("upgrade", parents=[common], help="apply migrations up to head").set_defaults(
        func=cmd_db_upgrade
    )
    dbp.add_parser("status", parents=[common], help="show the schema revision").set_defaults(func=cmd_db_status)
    dbp.add_parser("stop", parents=[common], help="stop the embedded PostgreSQL (it outlives serve on purpose)"
                   ).set_defaults(func=cmd_db_stop)

    kp = groups.add_parser("keys", parents=[common], help="customer API keys").add_subparsers(
        dest="action", required=True
    )
    issue = kp.add_parser("issue", parents=[common], help="issue a key (shown once)")
    issue.add_argument("--customer", required=True)
    issue.add_argument("--tier", default="standard")
    issue.add_argument("--ttl-days", type=int, default=None, help="default: SPECIALISTS_KEY_DEFAULT_TTL_DAYS")
    issue.add_argument("--label", default="")
    issue.set_defaults(func=cmd_keys_issue)
    lst = kp.add_parser("list", parents=[common], help="list keys (never the keys themselves)")
    lst.add_argument("--customer", default=None)
    lst.set_defaults(func=cmd_keys_list)
    revoke = kp.add_parser("revoke", parents=[common], help="revoke a key on every instance")
    revoke.add_argument("key_id")
    revoke.add_argument("--reason", required=True)
    revoke.set_defaults(func=cmd_keys_revoke)
    verify = kp.add_parser("verify", parents=[common], help="check a key read from standard input")
    verify.set_defaults(func=cmd_keys_verify)

    from ops import cli_customers, cli_ledger, cli_push

    cli_customers.register(groups, common)
    cli_push.register(groups, common)
    cli_ledger.register(groups, common)
    from ops import cli_health, cli_specialists

    cli_specialists.register(groups, common)
    from ops import cli_journey

    cli_journey.register(groups, common)
    cli_health.register(groups, common)
    from ops.drill import cli as cli_drill

    cli_drill.register(groups, common)
    return parser


def _load_settings() -> Settings:
    return Settings()


EXIT_INTERRUPTED = 130  # the shell's status for a process ended by SIGINT


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before a command installed its own handler: an exit, not a traceback
        return EXIT_INTERRUPTED


def _usage_error(problem: UsageError, *, as_json: bool) -> int:
    if not as_json and problem.parser is not None:
        problem.parser.print_usage(sys.stderr)
    return fail("usage_error", problem.message, as_json=as_json, exit_code=EXIT_USAGE)


def _suggest(ctx: Ctx, near, typo: str) -> str:
    """"; did you mean 'x'?" from the ids near ``typo``, or nothing (no id, or the database went away)."""
    if not typo or ctx._engine is None:
        return ""
    try:
        with ctx._engine.connect() as conn:
            return did_you_mean(near(conn, typo))
    except Exception:  # a suggestion is a courtesy: the refusal stands without it
        return ""


def _main(argv: list[str] | None) -> int:
    flags = GlobalFlags()
    parser = build_parser(flags)
    words = sys.argv[1:] if argv is None else argv
    try:
        args = parser.parse_args(argv)
        operator = flags.operator()
    except UsageError as problem:
        # An error can come before --json is read (a bad value earlier on the line): the word itself counts.
        return _usage_error(problem, as_json=flags.json or "--json" in words)
    as_json = flags.json
    for name, nearest in settings_names.unknown_variables(os.environ):  # a typo must not pass for a default
        output.warn("setting_unknown", settings_names.warning_of(name, nearest))
    try:
        settings = _load_settings()
    except ValidationError as invalid:
        return fail("settings_invalid", f"invalid settings: {describe_invalid(invalid)}", as_json=as_json,
                    exit_code=EXIT_CONFIG)
    try:
        # One machine: secrets `serve` generated into the data dir (only `serve` generates them).
        settings, generated = local_secrets.with_local_secrets(settings, generate=args.func is cmd_serve)
    except local_secrets.SecretMissing as problem:
        return fail(problem.code, problem.message, as_json=as_json, exit_code=EXIT_CONFIG)
    ctx = Ctx(settings=settings, as_json=as_json, operator=operator or getpass.getuser(), generated_secrets=generated)
    try:
        return args.func(ctx, args)
    except ValidationError as invalid:  # e.g. serve --port 0
        return fail("settings_invalid", f"invalid settings: {describe_invalid(invalid)}", as_json=as_json,
                    exit_code=EXIT_CONFIG)
    except (db.SchemaNotAtHead, db.DatabaseUnavailable) as problem:
        return fail(problem.code, problem.message, as_json=as_json, exit_code=EXIT_DATABASE)
    except SpecInvalid as invalid_spec:
        return fail(invalid_spec.code, invalid_spec.message, as_json=as_json, exit_code=EXIT_CONFIG)
    except keys.KeyRefused as refused:
        exit_code = EXIT_CONFIG if refused.code == keys.NO_SECRET else EXIT_REFUSED
        return fail(refused.code, refused.message, as_json=as_json, exit_code=exit_code)
    except LedgerInputInvalid as invalid:  # e.g. a malformed --customer
        return fail(invalid.code, invalid.message, as_json=as_json, exit_code=EXIT_USAGE)
    except CustomerNotFound as unknown:
        return fail(unknown.code, unknown.message + _suggest(ctx, near_customer_ids, unknown.customer_id),
                    as_json=as_json)
    except keys.KeyNotFound as unknown:
        return fail(unknown.code, unknown.message + _suggest(ctx, near_key_ids, unknown.details.get("key_id", "")),
                    as_json=as_json)
    except ServiceError as problem:
        return fail(problem.code, problem.message, as_json=as_json)
    finally:
        if ctx._engine is not None:
            ctx._engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
