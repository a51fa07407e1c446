"""Who is calling, and the task-store owner scope that follows from it.

The a2a-sdk task store filters every read by ``owner`` (the call context's
user name). The edge sets it to ``<customer>:<specialist>``, so another
customer's task, or a task of another specialist, answers exactly like a task
that does not exist. Anonymous callers (tariff-0 specialists, when the
operator allows them) share one owner per specialist, spelled with a
character customer ids cannot contain.
"""

from __future__ import annotations

from dataclasses import dataclass

from a2a.auth.user import User

ANONYMOUS = "~anonymous"  # '~' is not allowed in customer ids, so it can never collide with one


@dataclass(frozen=True)
class Identity:
    """The caller of one request, as the auth middleware resolved it."""

    customer_id: str | None  # None: anonymous
    key_id: str | None
    tier: str | None
    client_address: str

    @property
    def anonymous(self) -> bool:
        return self.customer_id is None

    @property
    def customer_key(self) -> str:
        """The customer's namespace for idempotency and contexts."""
        return self.customer_id or ANONYMOUS

    def owner(self, specialist_id: str) -> str:
        return f"{self.customer_key}:{specialist_id}"


class EdgeUser(User):
    """The SDK's user: its name is the owner scope of the task store."""

    def __init__(self, identity: Identity, specialist_id: str) -> None:
        self.identity = identity
        self.specialist_id = specialist_id

    @property
    def is_authenticated(self) -> bool:
        return not self.identity.anonymous

    @property
    def user_name(self) -> str:
        return self.identity.owner(self.specialist_id)
