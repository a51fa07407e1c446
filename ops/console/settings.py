"""The operator console's section of the settings (``settings.console``).

Part of the one ``Settings`` object (core/settings.py); this module imports only core/settings_base.py.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from core.settings_base import CommaList, SecretList, Section

class ConsoleSettings(Section):
    """The operator console (ops/console, docs/OPERATIONS.md "The console"): where it listens, who may log in, its
    sessions and the bounds of what a browser may send it."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_CONSOLE_")

    host: str = Field(default="127.0.0.1", description="Address the console listens on (0.0.0.0 in a container).")
    port: int = Field(default=8090, ge=1, le=65535, description="Port the console listens on.")
    auth: Literal["local", "iap"] = Field(
        default="local",
        description="Who the operator is: `local` (one machine: the operator secret, and the operator is "
        "SPECIALISTS_CONSOLE_LOCAL_OPERATOR) or `iap` (production: the Google identity in the IAP JWT, which must "
        "be in SPECIALISTS_CONSOLE_OPERATORS).",
    )
    operator_secret: SecretStr | None = Field(
        default=None,
        description="With auth=local, the secret a person types to log in (generated into the local secrets by "
        "`specialists serve`).",
    )
    local_operator: str = Field(
        default="", max_length=200, pattern=r"^[A-Za-z0-9_.@:+-]*$",
        description="With auth=local, the operator every console action is journalled as (empty: the OS user).",
    )
    session_secrets: SecretList = Field(
        default_factory=list,
        description="Comma-separated secrets, newest first, that sign the console's session cookies; the newest "
        "signs, all verify (a rotation puts a new one in front).",
    )
    min_secret_chars: int = Field(default=32, ge=16, le=1024, description="Shortest console secret accepted at start-up.")
    session_ttl_s: int = Field(
        default=8 * 3600, ge=60, le=7 * 86400,
        description="How long a console session lasts after its login; then the operator logs in again.",
    )
    operators: CommaList = Field(
        default_factory=list,
        description="With auth=iap, the Google accounts (emails, comma-separated) allowed in; anyone else is "
        "refused even when IAP let them through.",
    )
    iap_audience: str = Field(
        default="", max_length=300,
        description="With auth=iap, the audience of the IAP JWT (`/projects/NUMBER/...`, see docs/OPERATIONS.md).",
    )
    iap_certs_url: str = Field(
        default="https://www.gstatic.com/iap/verify/public_key",
        description="With auth=iap, where IAP's public keys (PEM by key id) are fetched from.",
    )
    iap_certs_cache_s: float = Field(default=3600.0, ge=1, le=86400, description="How long fetched IAP keys are reused.")
    iap_certs_refetch_s: float = Field(
        default=30.0, ge=1, le=3600,
        description="With auth=iap, the least time between two fetches of IAP's keys made because an assertion "
        "named a key id they lack; until then such an assertion is refused without a fetch (the miss is cached).",
    )
    allowed_origins: CommaList = Field(
        default_factory=list,
        description="Origins (`scheme://host[:port]`, comma-separated) whose pages may post to the console; any "
        "other Origin or Referer is refused. Empty: with auth=local, `http://HOST:PORT` of the console's own "
        "address (and `localhost` for a loopback one); with auth=iap it must be set (the console's https URL).",
    )
    login_failures_per_address: int = Field(
        default=10, ge=1, le=10_000,
        description="With auth=local, wrong operator secrets from one client address within "
        "SPECIALISTS_CONSOLE_LOGIN_WINDOW_S before that address's logins are refused (429) until the window passes.",
    )
    login_failures_global: int = Field(
        default=100, ge=1, le=1_000_000,
        description="With auth=local, wrong operator secrets from all addresses together within "
        "SPECIALISTS_CONSOLE_LOGIN_WINDOW_S before every login is refused (429) until the window passes.",
    )
    login_window_s: int = Field(
        default=300, ge=1, le=86400,
        description="The window the login failure limits count in (per console process).",
    )
    max_form_bytes: int = Field(
        default=16 * 1024, ge=1024, le=1024 * 1024,
        description="Largest form body the console reads; a larger one is refused before it is parsed.",
    )
    max_usage_days: int = Field(
        default=92, ge=1, le=366,
        description="Longest period the usage page charts (also bounded by SPECIALISTS_LEDGER_MAX_USAGE_DAYS).",
    )

    @model_validator(mode="after")
    def _auth_complete(self) -> "ConsoleSettings":
        for index, secret in enumerate(self.session_secrets):
            if len(secret.get_secret_value()) < self.min_secret_chars:
                raise ValueError(f"SPECIALISTS_CONSOLE_SESSION_SECRETS #{index + 1} is shorter than "
                                 f"SPECIALISTS_CONSOLE_MIN_SECRET_CHARS ({self.min_secret_chars})")
        if self.operator_secret is not None and len(self.operator_secret.get_secret_value()) < self.min_secret_chars:
            raise ValueError(f"SPECIALISTS_CONSOLE_OPERATOR_SECRET is shorter than SPECIALISTS_CONSOLE_MIN_SECRET_CHARS "
                             f"({self.min_secret_chars})")
        for email in self.operators:
            if "@" not in email or len(email) > 200 or any(c.isspace() for c in email):
                raise ValueError(f"SPECIALISTS_CONSOLE_OPERATORS: {email!r} is not an email address")
        for origin in self.allowed_origins:
            parts = urlsplit(origin)
            if (parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query
                    or parts.fragment or len(origin) > 300):
                raise ValueError(f"SPECIALISTS_CONSOLE_ALLOWED_ORIGINS: {origin!r} is not an origin "
                                 "(scheme://host[:port], no path)")
        return self
