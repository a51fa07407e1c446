"""Worker authentication: the signed job body and the Cloud Tasks OIDC token, each refusal with its code."""

from __future__ import annotations

import time

import pytest
from itsdangerous import TimestampSigner
from pydantic import ValidationError

from core.settings import Settings
from tests.workers.conftest import SERVICE_ACCOUNT, WORKER_SECRET
from tests.workers.oidc_issuer import CertsEndpoint, LocalKey, cloud_tasks_claims
from workers import auth
from workers.auth import JobSigner, OidcVerifier, WorkerAuthRefused

pytestmark = pytest.mark.timeout(60)

AUDIENCE = "https://worker.example.run.app"
OTHER_SECRET = "another-deployments-secret-" + "z" * 30


def signer(*secrets: str, audience: str = AUDIENCE, max_age_s: int = 3600) -> JobSigner:
    return JobSigner(list(secrets), audience=audience, max_age_s=max_age_s)


def refusal(action) -> WorkerAuthRefused:
    with pytest.raises(WorkerAuthRefused) as refused:
        action()
    return refused.value


def test_a_signed_body_verifies_and_carries_the_job_identity() -> None:
    body = signer(WORKER_SECRET).sign(job_id="job-7", specialist_id="scripted", deadline_s=12.5, payload={"k": [1, 2]})
    job = signer(WORKER_SECRET).verify(body)
    assert (job.job_id, job.specialist_id, job.deadline_s, job.payload) == ("job-7", "scripted", 12.5, {"k": [1, 2]})


def test_without_a_secret_nothing_is_signed_or_accepted() -> None:
    body = signer(WORKER_SECRET).sign(job_id="job-7", specialist_id="scripted", deadline_s=5)
    for action in (lambda: signer().verify(body), lambda: signer().sign(job_id="j", specialist_id="s", deadline_s=1)):
        refused = refusal(action)
        assert refused.code == auth.NOT_CONFIGURED and refused.http_status == 503
        assert "SPECIALISTS_WORKER_JOB_SECRETS" in refused.message


def test_a_tampered_body_is_refused() -> None:
    body = signer(WORKER_SECRET).sign(job_id="job-7", specialist_id="scripted", deadline_s=5).decode()
    prefix, token = body.rsplit(".", 1)[0], body.rsplit(".", 1)[1]
    # Re-encode the claims with another job id but keep the signature.
    version, secret_id, claims_b64, timestamp = prefix.split(".", 3)
    from itsdangerous.encoding import base64_decode, base64_encode

    forged_claims = base64_decode(claims_b64).replace(b"job-7", b"job-8")
    forged = f"{version}.{secret_id}.{base64_encode(forged_claims).decode()}.{timestamp}.{token}"
    assert refusal(lambda: signer(WORKER_SECRET).verify(forged.encode())).code == auth.BODY_TAMPERED


def test_a_body_forged_with_another_secret_is_refused() -> None:
    forged = signer(OTHER_SECRET).sign(job_id="job-7", specialist_id="scripted", deadline_s=5)
    assert refusal(lambda: signer(WORKER_SECRET).verify(forged)).code == auth.BODY_UNKNOWN_SECRET
    # The same forgery presenting our secret's id fails the signature instead.
    ours = signer(WORKER_SECRET).sign(job_id="x", specialist_id="s", deadline_s=1).decode().split(".")[1]
    relabelled = forged.decode().split(".", 2)
    relabelled[1] = ours
    assert refusal(lambda: signer(WORKER_SECRET).verify(".".join(relabelled).encode())).code == auth.BODY_TAMPERED


def test_an_expired_body_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(TimestampSigner, "get_timestamp", lambda self: int(time.time()) - 3700)
        old = signer(WORKER_SECRET).sign(job_id="job-7", specialist_id="scripted", deadline_s=5)
    refused = refusal(lambda: signer(WORKER_SECRET, max_age_s=3600).verify(old))
    assert refused.code == auth.BODY_EXPIRED and "SPECIALISTS_WORKER_JOB_MAX_AGE_S" in refused.message


def test_a_body_replayed_to_another_worker_audience_is_refused() -> None:
    body = signer(WORKER_SECRET, audience="https://staging-worker").sign(job_id="j", specialist_id="s", deadline_s=1)
    refused = refusal(lambda: signer(WORKER_SECRET).verify(body))
    assert refused.code == auth.BODY_WRONG_AUDIENCE and refused.http_status == 403


@pytest.mark.parametrize("body", [b"", b"\xff\xfe", b"v1.only-two", b"v2.abcdef12.token", b"hello world"])
def test_a_malformed_body_is_refused(body: bytes) -> None:
    assert refusal(lambda: signer(WORKER_SECRET).verify(body)).code in (auth.BODY_MALFORMED, auth.BODY_UNKNOWN_SECRET)


def test_signed_claims_that_break_the_schema_are_refused() -> None:
    from itsdangerous import URLSafeTimedSerializer
    import hashlib

    ser = URLSafeTimedSerializer(
        WORKER_SECRET, salt=auth._SALT, signer_kwargs={"digest_method": hashlib.sha256, "key_derivation": "hmac"}
    )
    token = ser.dumps({"job": "../../etc", "sp": "scripted", "aud": AUDIENCE, "dl": 5, "p": {}})
    body = f"v1.{auth._secret_id(WORKER_SECRET)}.{token}".encode()
    assert refusal(lambda: signer(WORKER_SECRET).verify(body)).code == auth.BODY_MALFORMED


def test_a_body_reads_as_itsdangerous_own_serializer_signs_and_reads_it() -> None:
    """The signer and its derived key are kept per secret (issue 44): the tokens are itsdangerous's, both ways."""
    import hashlib

    from itsdangerous import URLSafeTimedSerializer

    ser = URLSafeTimedSerializer(
        WORKER_SECRET, salt=auth._SALT, signer_kwargs={"digest_method": hashlib.sha256, "key_derivation": "hmac"}
    )
    claims = {"job": "job-1", "sp": "scripted", "aud": AUDIENCE, "dl": 5.0, "p": {"k": "v"}}
    theirs = f"v1.{auth._secret_id(WORKER_SECRET)}.{ser.dumps(claims)}".encode()
    ours = signer(WORKER_SECRET)
    assert (ours.verify(theirs).job_id, ours.verify(theirs).payload) == ("job-1", {"k": "v"})
    for _ in range(2):  # the kept key signs as the first derivation did
        body = ours.sign(job_id="job-2", specialist_id="scripted", deadline_s=5.0, payload={"k": "v"})
        assert ser.loads(body.decode().split(".", 2)[2]) == {**claims, "job": "job-2"}


def test_secrets_rotate_the_newest_signs_and_every_configured_one_verifies() -> None:
    new_secret = "the-new-worker-secret-" + "n" * 30
    old_body = signer(WORKER_SECRET).sign(job_id="j-old", specialist_id="s", deadline_s=1)
    rotating = signer(new_secret, WORKER_SECRET)
    assert rotating.verify(old_body).job_id == "j-old"
    new_body = rotating.sign(job_id="j-new", specialist_id="s", deadline_s=1)
    assert signer(new_secret).verify(new_body).job_id == "j-new"
    assert refusal(lambda: signer(new_secret).verify(old_body)).code == auth.BODY_UNKNOWN_SECRET  # retired


def test_a_short_worker_secret_stops_start_up() -> None:
    with pytest.raises(ValidationError, match="SPECIALISTS_WORKER_JOB_SECRETS"):
        Settings(worker={"job_secrets": "short"})


# --- OIDC ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def google_key() -> LocalKey:
    return LocalKey("key-1")


@pytest.fixture
def certs(google_key: LocalKey):
    with CertsEndpoint([google_key]) as endpoint:
        yield endpoint
        endpoint.keys = [google_key]


def verifier(certs: CertsEndpoint, **overrides) -> OidcVerifier:
    options = dict(
        audience=AUDIENCE,
        service_account_email=SERVICE_ACCOUNT,
        certs_url=certs.url,
        certs_cache_s=300,
        clock_skew_s=10,
    )
    options.update(overrides)
    return OidcVerifier(**options)


def bearer(token: str) -> str:
    return "Bearer " + token


def test_a_cloud_tasks_token_verifies_against_the_published_certificates(google_key, certs) -> None:
    identity = verifier(certs).verify(bearer(google_key.token(**cloud_tasks_claims(AUDIENCE, SERVICE_ACCOUNT))))
    assert identity.email == SERVICE_ACCOUNT


def test_certificates_are_fetched_once_and_cached(google_key, certs) -> None:
    check = verifier(certs)
    for _ in range(5):
        check.verify(bearer(google_key.token(**cloud_tasks_claims(AUDIENCE, SERVICE_ACCOUNT))))
    assert certs.fetches == 1


def test_a_rotated_signing_key_is_picked_up_by_refetching(google_key, certs, monkeypatch) -> None:
    check = verifier(certs)
    check.verify(bearer(google_key.token(**cloud_tasks_claims(AUDIENCE, SERVICE_ACCOUNT))))
    rotated = LocalKey("key-2")
    certs.keys = [google_key, rotated]
    monkeypatch.setattr(OidcVerifier, "MIN_REFETCH_INTERVAL_S", 0.0)
    check.verify(bearer(rotated.token(**cloud_tasks_claims(AUDIENCE, SERVICE_ACCOUNT))))
    assert certs.fetches == 2


def test_invented_key_ids_cannot_make_the_worker_refetch_in_a_loop(google_key, certs) -> None:
    # The refetch interval on a clock of the test's own: a loaded machine that takes 5 s to make the five keys
    # must not let a second fetch through (it did, at load 11-26, on the real clock).
    now = [1000.0]
    check = verifier(certs, monotonic=lambda: now[0])
    check.verify(bearer(google_key.token(**cloud_tasks_claims(AUDIENCE, SERVICE_ACCOUNT))))

    def invented(index: int) -> str:
        return refusal(lambda: check.verify(bearer(LocalKey(f"invented-{index}").token(
            **cloud_tasks_claims(AUDIENCE, SERVICE_ACCOUNT))))).code

    for index in range(5):
        now[0] += OidcVerifier.MIN_REFETCH_INTERVAL_S / 10
        assert invented(index) == auth.OIDC_BAD_SIGNATURE
    assert certs.fetches == 1
    # Once the interval has passed, an unknown key id is worth one refetch again (a rotation), and only one.
    now[0] += OidcVerifier.MIN_REFETCH_INTERVAL_S
    assert [invented(5), invented(6)] == [auth.OIDC_BAD_SIGNATURE] * 2
    assert certs.fetches == 2


@pytest.mark.parametrize(
    ("claims", "code", "status"),
    [
        # iat/exp as seconds from when the test runs (not from collection: a slow session would age them).
        (dict(exp=-60, iat=-3660), auth.OIDC_EXPIRED, 401),
        (dict(iat=600, exp=4200), auth.OIDC_NOT_YET_VALID, 401),
        (dict(iss="https://evil.example"), auth.OIDC_WRONG_ISSUER, 401),
        (dict(aud="https://another-service.run.app"), auth.OIDC_WRONG_AUDIENCE, 403),
        (dict(email="someone@else.iam.gserviceaccount.com"), auth.OIDC_WRONG_ACCOUNT, 403),
        (dict(email_verified=False), auth.OIDC_WRONG_ACCOUNT, 403),
    ],
)
def test_a_token_with_the_wrong_claims_is_refused(google_key, certs, claims, code, status) -> None:
    claims = {k: int(time.time()) + v if k in ("iat", "exp") else v for k, v in claims.items()}
    token = google_key.token(**cloud_tasks_claims(AUDIENCE, SERVICE_ACCOUNT, **claims))
    refused = refusal(lambda: verifier(certs).verify(bearer(token)))
    assert (refused.code, refused.http_status) == (code, status)


def test_a_token_signed_by_another_key_under_a_known_key_id_is_refused(certs) -> None:
    impostor = LocalKey("key-1")  # same key id, different key pair
    token = impostor.token(**cloud_tasks_claims(AUDIENCE, SERVICE_ACCOUNT))
    assert refusal(lambda: verifier(certs).verify(bearer(token))).code == auth.OIDC_BAD_SIGNATURE


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer not-a-jwt", "Bearer a.b.c"])
def test_a_missing_or_malformed_token_is_refused(certs, header) -> None:
    assert refusal(lambda: verifier(certs).verify(header)).code in (auth.OIDC_MISSING, auth.OIDC_MALFORMED)


def test_an_unreachable_certificates_endpoint_asks_for_a_retry(google_key, certs) -> None:
    certs.failing = True
    token = google_key.token(**cloud_tasks_claims(AUDIENCE, SERVICE_ACCOUNT))
    refused = refusal(lambda: verifier(certs).verify(bearer(token)))
    assert refused.code == auth.OIDC_CERTS_UNAVAILABLE and refused.http_status == 503
