"""Customer keys: every refusal has its own reason, rotation keeps old keys valid, revocation is bounded."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from ledger import keys
from tests import commands

SECRET_A = "a" * 48
SECRET_B = "b" * 48


def customer() -> str:
    return "cust-" + uuid.uuid4().hex[:12]


def issue(engine, signer, **kw):
    return keys.issue_key(engine, signer, customer_id=kw.pop("customer_id", customer()), ttl=kw.pop("ttl", timedelta(days=30)), **kw)


def refusal(verifier_or_signer, token: str, **kw) -> str:
    check = getattr(verifier_or_signer, "verify", None) or verifier_or_signer.check
    with pytest.raises(keys.KeyRefused) as refused:
        check(token, **kw)
    assert refused.value.message  # a person can act on it
    return refused.value.code


def test_an_issued_key_verifies_to_its_customer_and_tier(engine):
    signer = keys.KeySigner([SECRET_A], "test")
    issued = issue(engine, signer, tier="gold")
    assert issued.token.startswith("sk_test_")
    identity = keys.KeyVerifier(signer, engine, revocation_cache_s=0).verify(issued.token)
    assert identity == issued.identity
    assert identity.tier == "gold"


def test_the_key_itself_is_never_stored(engine):
    from sqlalchemy import text

    issued = issue(engine, keys.KeySigner([SECRET_A], "test"))
    signature = issued.token.rsplit(".", 1)[1]
    with engine.connect() as conn:
        row = conn.execute(text("SELECT row_to_json(k)::text FROM api_keys k WHERE key_id = :k"), {"k": issued.identity.key_id}).scalar()
    assert issued.identity.key_id in row
    assert signature not in row and issued.token not in row


def test_each_failure_has_its_own_reason(engine):
    signer = keys.KeySigner([SECRET_A], "test")
    verifier = keys.KeyVerifier(signer, engine, revocation_cache_s=0)
    good = issue(engine, signer).token

    assert refusal(verifier, "not-a-key") == keys.MALFORMED
    assert refusal(verifier, "") == keys.MALFORMED
    assert refusal(verifier, "sk_test_" + "x" * 5000) == keys.MALFORMED
    assert refusal(verifier, good.replace("sk_test_", "sk_live_", 1)) == keys.WRONG_ENVIRONMENT

    prefix, payload_and_sig = good[: len("sk_test_12345678_")], good[len("sk_test_12345678_") :]
    payload, sig = payload_and_sig.split(".")
    altered = prefix + payload[:-2] + ("AA" if payload[-2:] != "AA" else "BB") + "." + sig
    assert refusal(verifier, altered) == keys.TAMPERED
    assert refusal(verifier, good[:-3]) == keys.TAMPERED

    other = keys.KeySigner([SECRET_B], "test")
    assert refusal(verifier, other.sign(keys.KeyIdentity("key_x", "c", "t", "test", datetime.now(timezone.utc), datetime.now(timezone.utc) + timedelta(days=1)))) == keys.WRONG_SECRET

    forged_unknown = signer.sign(
        keys.KeyIdentity("key_never_issued", "c", "t", "test", datetime.now(timezone.utc), datetime.now(timezone.utc) + timedelta(days=1))
    )
    assert refusal(verifier, forged_unknown) == keys.UNKNOWN


def test_an_expired_key_is_refused_as_expired(engine):
    signer = keys.KeySigner([SECRET_A], "test")
    verifier = keys.KeyVerifier(signer, engine, revocation_cache_s=0)
    issued = issue(engine, signer, ttl=timedelta(days=1))
    assert verifier.verify(issued.token)
    assert refusal(verifier, issued.token, now=datetime.now(timezone.utc) + timedelta(days=2)) == keys.EXPIRED


def test_with_no_secret_every_key_is_refused_and_none_can_be_issued(engine):
    signed = issue(engine, keys.KeySigner([SECRET_A], "test")).token
    closed = keys.KeySigner([], "test")
    assert refusal(closed, signed) == keys.NO_SECRET
    with pytest.raises(keys.KeyRefused):
        issue(engine, closed)


def test_rotation_keeps_old_keys_valid_and_signs_with_the_newest(engine):
    old_signer = keys.KeySigner([SECRET_A], "test")
    old_key = issue(engine, old_signer).token
    rotated = keys.KeySigner([SECRET_B, SECRET_A], "test")
    verifier = keys.KeyVerifier(rotated, engine, revocation_cache_s=0)
    assert verifier.verify(old_key)
    new_key = issue(engine, rotated).token
    assert verifier.verify(new_key)
    # The new key is signed by B: a service that only knows A refuses it.
    assert refusal(keys.KeyVerifier(old_signer, engine, revocation_cache_s=0), new_key) == keys.WRONG_SECRET
    # Retiring A refuses keys signed by A with a reason that says so.
    assert refusal(keys.KeyVerifier(keys.KeySigner([SECRET_B], "test"), engine, revocation_cache_s=0), old_key) == keys.WRONG_SECRET


def test_revocation_takes_effect_within_the_cache_bound(engine):
    signer = keys.KeySigner([SECRET_A], "test")
    issued = issue(engine, signer)
    bound_s = 0.5
    verifier = keys.KeyVerifier(signer, engine, revocation_cache_s=bound_s)
    assert verifier.verify(issued.token)
    assert keys.revoke_key(engine, issued.identity.key_id, reason="laptop lost", operator="ops") is True
    assert keys.revoke_key(engine, issued.identity.key_id, reason="again", operator="ops") is False
    # The cache is a clock rule (the status checked above is reused for bound_s by time.monotonic), so letting
    # that much time pass is enough: once it has, the very next check must see the revocation.
    time.sleep(bound_s)
    try:
        verifier.verify(issued.token)
    except keys.KeyRefused as refused:
        assert refused.code == keys.REVOKED
    else:
        pytest.fail(f"a revoked key was still accepted {bound_s:g} s after its last check (SPECIALISTS_REVOCATION_CACHE_S)")
    # A fresh instance refuses it at once.
    assert refusal(keys.KeyVerifier(signer, engine, revocation_cache_s=60), issued.token) == keys.REVOKED


def test_revoking_an_unknown_key_says_how_to_find_keys(engine):
    with pytest.raises(Exception) as missing:
        keys.revoke_key(engine, "key_nope", reason="x", operator="ops")
    assert "specialists keys list" in str(missing.value)


def test_invalid_customer_ids_are_refused_before_anything_is_written(engine):
    with pytest.raises(Exception) as bad:
        issue(engine, keys.KeySigner([SECRET_A], "test"), customer_id="Robert'); DROP TABLE customers;--")
    assert getattr(bad.value, "code", "") == "customer_id_invalid"


def run_cli(env, *args, stdin: str | None = None):
    return commands.specialists(args, env, stdin)  # in this process (tests/commands.py)


def test_the_operator_command_issues_lists_verifies_and_revokes_keys(service_env):
    cust = customer()
    assert run_cli(service_env, "customers", "add", "--customer", cust).returncode == 0  # a key needs its customer
    issued = run_cli(service_env, "keys", "issue", "--customer", cust, "--tier", "gold", "--json")
    assert issued.returncode == 0, issued.stderr
    record = json.loads(issued.stdout)
    token, key_id = record["key"], record["key_id"]

    listed = run_cli(service_env, "keys", "list", "--customer", cust, "--json")
    assert listed.returncode == 0
    rows = json.loads(listed.stdout)
    assert [r["key_id"] for r in rows] == [key_id]
    assert token not in listed.stdout

    human = run_cli(service_env, "keys", "list", "--customer", cust)
    assert key_id in human.stdout and "customer_id" in human.stdout

    assert run_cli(service_env, "keys", "verify", "--json", stdin=token + "\n").returncode == 0
    revoked = run_cli(service_env, "keys", "revoke", key_id, "--reason", "rotation drill", "--json")
    assert revoked.returncode == 0 and json.loads(revoked.stdout)["revoked"] is True
    refused = run_cli(service_env, "keys", "verify", "--json", stdin=token + "\n")
    assert refused.returncode == 1
    assert json.loads(refused.stdout)["reason"] == keys.REVOKED


def test_the_operator_command_fails_closed_without_a_secret_and_names_the_setting(service_env):
    env = dict(service_env)
    env.pop("SPECIALISTS_KEY_SIGNING_SECRETS")
    result = run_cli(env, "keys", "issue", "--customer", customer())
    assert result.returncode == 3
    assert "SPECIALISTS_KEY_SIGNING_SECRETS" in result.stderr


def test_a_short_secret_is_refused_at_start_up_without_echoing_it(service_env):
    env = dict(service_env, SPECIALISTS_KEY_SIGNING_SECRETS="tooshort-secret-value")
    result = run_cli(env, "keys", "list")
    assert result.returncode == 3
    assert "SPECIALISTS_KEY_MIN_SECRET_CHARS" in result.stderr
    assert "tooshort-secret-value" not in result.stderr + result.stdout


def test_a_schema_not_at_head_stops_the_command_with_the_fix(service_env, server_url):
    from tests.conftest import empty_database

    with empty_database(server_url, "specialists_cli_empty") as url:
        env = dict(service_env, DATABASE_URL=url)
        result = run_cli(env, "keys", "list")
        assert result.returncode == 4
        assert "specialists db upgrade" in result.stderr
        upgraded = run_cli(env, "db", "upgrade", "--json")
        assert upgraded.returncode == 0, upgraded.stderr
        assert run_cli(env, "keys", "list").returncode == 0


# --- the environment under the signature (issue 15) -----------------------------------------------------------


def test_a_key_whose_environment_prefix_was_rewritten_is_refused_as_tampered(engine):
    # Two deployments that share their signing secrets (and, here, their key records): a live key rewritten to
    # sk_test_ must not pass for a test key.
    live, test = keys.KeySigner([SECRET_A], "live"), keys.KeySigner([SECRET_A], "test")
    issued = issue(engine, live)
    rewritten = issued.token.replace("sk_live_", "sk_test_", 1)
    assert refusal(keys.KeyVerifier(test, engine, revocation_cache_s=0), rewritten) == keys.TAMPERED
    assert refusal(test, rewritten) == keys.TAMPERED  # the signature alone decides it
    assert keys.KeyVerifier(live, engine, revocation_cache_s=0).verify(issued.token).environment == "live"


def _legacy_token(secret: str, environment: str, key_id: str, customer_id: str, issued_at: datetime,
                  expires_at: datetime) -> str:
    """A key as the code before migration 0110 signed it: the environment only in the prefix."""
    import hashlib

    from itsdangerous import Signer
    from itsdangerous.encoding import base64_encode

    payload = {"kid": key_id, "cus": customer_id, "tier": "standard", "iat": int(issued_at.timestamp()),
               "exp": int(expires_at.timestamp())}
    body = base64_encode(json.dumps(payload, separators=(",", ":"), sort_keys=True))
    signed = Signer(secret, salt="specialists.api-key.v1", digest_method=hashlib.sha256, key_derivation="hmac").sign(body)
    return f"sk_{environment}_{keys._secret_id(secret)}_{signed.decode()}"


def test_a_key_issued_before_the_environment_was_signed_verifies_until_it_expires_and_keys_list_tells_it(
    service_env, server_url
):
    from sqlalchemy import create_engine, text

    from core import db
    from tests.conftest import empty_database

    with empty_database(server_url, "specialists_keys_legacy") as url:
        engine = create_engine(url)
        try:
            db.upgrade(url, "0100")  # the schema before keys signed their environment
            cust, key_id = customer(), keys.new_key_id()
            issued_at = datetime.now(timezone.utc).replace(microsecond=0)
            expires_at = issued_at + timedelta(days=2)
            with engine.begin() as conn:  # what the code before 0110 wrote when it issued a key
                keys.ensure_customer(conn, cust)
                conn.execute(text("INSERT INTO api_keys (key_id, customer_id, environment, tier, label, issued_at, "
                                  "expires_at) VALUES (:k, :c, 'test', 'standard', '', :i, :x)"),
                             {"k": key_id, "c": cust, "i": issued_at, "x": expires_at})
            legacy = _legacy_token(SECRET_A, "test", key_id, cust, issued_at, expires_at)
            db.upgrade(url)

            test = keys.KeySigner([SECRET_A], "test")
            verifier = keys.KeyVerifier(test, engine, revocation_cache_s=0)
            identity = verifier.verify(legacy)
            assert (identity.key_id, identity.environment_signed) == (key_id, False)
            assert refusal(verifier, legacy, now=expires_at) == keys.EXPIRED
            # Its prefix is not under its signature, so its record vouches for it: a rewritten one is refused.
            live_verifier = keys.KeyVerifier(keys.KeySigner([SECRET_A], "live"), engine, revocation_cache_s=0)
            assert refusal(live_verifier, legacy.replace("sk_test_", "sk_live_", 1)) == keys.TAMPERED
            new = issue(engine, test, customer_id=cust)
            assert verifier.verify(new.token).environment_signed

            env = dict(service_env, DATABASE_URL=url, SPECIALISTS_KEY_SIGNING_SECRETS=SECRET_A)
            listed = run_cli(env, "keys", "list", "--customer", cust, "--json")
            assert listed.returncode == 0, listed.stderr
            forms = {row["key_id"]: row["key_form"] for row in json.loads(listed.stdout)}
            assert forms == {key_id: keys.FORM_ENV_UNSIGNED, new.identity.key_id: keys.FORM_ENV_SIGNED}
            human = run_cli(env, "keys", "list", "--customer", cust)
            assert "key_form" in human.stdout and keys.FORM_ENV_UNSIGNED in human.stdout
        finally:
            engine.dispose()


@pytest.mark.anyio
async def test_the_edges_verifier_checks_a_keys_signature_once_and_its_expiry_and_revocation_at_every_request(
    engine, database_url, settings
):
    """``AsyncKeyVerifier`` keeps a key that passed its signature check (issue 44): the next request with it is not
    unsigned again, and is still refused once the key expired or was revoked."""
    from core import db

    signer = keys.KeySigner([SECRET_A], "test")
    issued = issue(engine, signer, ttl=timedelta(days=1))
    checks = []
    check = signer.check
    signer.check = lambda key, **kw: checks.append(key) or check(key, **kw)  # type: ignore[method-assign]
    async_engine = db.make_async_engine(database_url, settings)
    try:
        verifier = keys.AsyncKeyVerifier(signer, async_engine, revocation_cache_s=0)
        for _ in range(3):
            assert (await verifier.verify(issued.token)).key_id == issued.identity.key_id
        assert checks == [issued.token]
        with pytest.raises(keys.KeyRefused) as expired:
            await verifier.verify(issued.token, now=datetime.now(timezone.utc) + timedelta(days=2))
        assert expired.value.code == keys.EXPIRED
        with pytest.raises(keys.KeyRefused) as tampered:  # another text is checked, and refused, as before
            await verifier.verify(issued.token[:-2] + ("AA" if not issued.token.endswith("AA") else "BB"))
        assert tampered.value.code == keys.TAMPERED
        keys.revoke_key(engine, issued.identity.key_id, reason="test", operator="test")
        with pytest.raises(keys.KeyRefused) as revoked:
            await verifier.verify(issued.token)
        assert revoked.value.code == keys.REVOKED
        assert checks.count(issued.token) == 1
    finally:
        await async_engine.dispose()
