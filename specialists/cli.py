"""The `specialists` operator command: database, keys, credits, reservations, the ledger, the service.

Every subcommand prints a table for people and accepts ``--json`` for scripts;
exit codes are listed in ``specialists.output``.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property

from pydantic import ValidationError
from sqlalchemy import Engine

from core import db
from core.errors import ServiceError
from core.settings import Settings
from core.specs import SpecInvalid
from ledger import keys
from specialists import output
from specialists.output import EXIT_CONFIG, EXIT_DATABASE, EXIT_OK, EXIT_REFUSED, emit, fail, say


@dataclass
class Ctx:
    """What a subcommand needs: settings, the database (opened on first use), output mode."""

    settings: Settings
    as_json: bool
    operator: str
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
            [s.get_secret_value() for s in self.settings.key_signing_secrets], self.settings.key_environment
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


def _current_or_none(ctx: Ctx) -> str | None:
    try:
        return db.current_revision(ctx.engine)
    except Exception as exc:
        raise db.DatabaseUnavailable(
            f"cannot reach the database at {db.redact_url(ctx.url)} ({type(exc).__name__}); check DATABASE_URL"
        ) from exc


# --- keys -------------------------------------------------------------------

_KEY_COLUMNS = ["key_id", "customer_id", "environment", "tier", "label", "issued_at", "expires_at", "revoked_at"]


def cmd_keys_issue(ctx: Ctx, args: argparse.Namespace) -> int:
    ttl_days = args.ttl_days if args.ttl_days is not None else ctx.settings.key_default_ttl_days
    if not 1 <= ttl_days <= 3650:
        return fail("ttl_invalid", "--ttl-days must be between 1 and 3650", as_json=ctx.as_json)
    issued = keys.issue_key(
        ctx.engine_at_head(),
        ctx.signer(),
        customer_id=args.customer,
        tier=args.tier,
        ttl=timedelta(days=ttl_days),
        label=args.label,
    )
    record = {
        "key_id": issued.identity.key_id,
        "customer_id": issued.identity.customer_id,
        "tier": issued.identity.tier,
        "environment": issued.identity.environment,
        "issued_at": issued.identity.issued_at,
        "expires_at": issued.identity.expires_at,
        "key": issued.token,
    }
    if ctx.as_json:
        output.emit_json(record)
    else:
        emit({k: v for k, v in record.items() if k != "key"}, as_json=False, title="key issued")
        say("The key is shown once and is not stored; hand it to the customer now:")
        print(issued.token)
    return EXIT_OK


def cmd_keys_list(ctx: Ctx, args: argparse.Namespace) -> int:
    rows = keys.list_keys(ctx.engine_at_head(), args.customer)
    emit(rows, as_json=ctx.as_json, columns=_KEY_COLUMNS, title="keys")
    return EXIT_OK


def cmd_keys_revoke(ctx: Ctx, args: argparse.Namespace) -> int:
    changed = keys.revoke_key(ctx.engine_at_head(), args.key_id, reason=args.reason, operator=ctx.operator)
    emit(
        {
            "key_id": args.key_id,
            "revoked": True,
            "already_revoked": not changed,
            "effective_within_s": ctx.settings.revocation_cache_s,
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
            "expires_at": identity.expires_at,
        },
        as_json=ctx.as_json,
        title="key is valid",
    )
    return EXIT_OK


# --- serve ------------------------------------------------------------------


def cmd_serve(ctx: Ctx, args: argparse.Namespace) -> int:
    """Start the A2A edge (uvicorn) on SPECIALISTS_EDGE_HOST:SPECIALISTS_EDGE_PORT until stopped."""
    settings = ctx.settings.model_copy()
    for name, value in (("edge_host", args.host), ("edge_port", args.port)):
        if value is not None:  # validated like the environment variable would be
            settings.__pydantic_validator__.validate_assignment(settings, name, value)
    if settings.embedded:
        # The embedded database belongs to this machine's service: bring it to head.
        db.upgrade(ctx.url)
    db.require_schema_at_head(ctx.engine)
    from app.server import serve  # the web stack loads only for this command
    from core.specs import load_specs

    specs = load_specs(settings.specs_dir)  # an invalid spec stops here, naming the file and field
    emit(
        {
            "database": db.redact_url(ctx.url),
            "embedded": settings.embedded,
            "schema": db.current_revision(ctx.engine),
            "key_signing_secrets": len(settings.key_signing_secrets),
            "specialists": ", ".join(sorted(specs)),
            "url": settings.public_url,
        },
        as_json=ctx.as_json,
        title="service starting",
    )
    ctx.engine.dispose()
    serve(settings, ctx.url)
    return EXIT_OK


# --- wiring -----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
    common.add_argument("--operator", default=None, help="who is acting, for audit records (default: OS user)")

    parser = argparse.ArgumentParser(prog="specialists", description=__doc__.splitlines()[0], parents=[common])
    groups = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")

    serve = groups.add_parser("serve", parents=[common], help="run the A2A edge on this machine")
    serve.add_argument("--host", default=None, help="default: SPECIALISTS_EDGE_HOST (127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="default: SPECIALISTS_EDGE_PORT (8080)")
    serve.set_defaults(func=cmd_serve)

    dbp = groups.add_parser("db", parents=[common], help="database schema").add_subparsers(
        dest="action", required=True
    )
    dbp.add_parser("upgrade", parents=[common], help="apply migrations up to head").set_defaults(
        func=cmd_db_upgrade
    )
    dbp.add_parser("status", parents=[common], help="show the schema revision").set_defaults(func=cmd_db_status)

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

    from specialists import cli_ledger

    cli_ledger.register(groups, common)
    return parser


def _load_settings() -> Settings:
    return Settings()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    as_json = bool(getattr(args, "json", False))
    try:
        settings = _load_settings()
    except ValidationError as invalid:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in invalid.errors(include_input=False)
        )
        return fail("settings_invalid", f"invalid settings: {problems}", as_json=as_json, exit_code=EXIT_CONFIG)
    ctx = Ctx(settings=settings, as_json=as_json, operator=args.operator or getpass.getuser())
    try:
        return args.func(ctx, args)
    except ValidationError as invalid:  # e.g. serve --port 0
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in invalid.errors(include_input=False))
        return fail("settings_invalid", f"invalid settings: {problems}", as_json=as_json, exit_code=EXIT_CONFIG)
    except (db.SchemaNotAtHead, db.DatabaseUnavailable) as problem:
        return fail(problem.code, problem.message, as_json=as_json, exit_code=EXIT_DATABASE)
    except SpecInvalid as invalid_spec:
        return fail(invalid_spec.code, invalid_spec.message, as_json=as_json, exit_code=EXIT_CONFIG)
    except keys.KeyRefused as refused:
        exit_code = EXIT_CONFIG if refused.code == keys.NO_SECRET else EXIT_REFUSED
        return fail(refused.code, refused.message, as_json=as_json, exit_code=exit_code)
    except ServiceError as problem:
        return fail(problem.code, problem.message, as_json=as_json)
    finally:
        if ctx._engine is not None:
            ctx._engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
