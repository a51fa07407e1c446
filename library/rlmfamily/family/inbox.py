"""The family inbox: retained messages between an agent and its parent, direct children and siblings.

- Routing follows the family's agent links: an agent reaches its parent, its
  direct children and its siblings (same parent), nobody else. A grandchild or
  a cousin is refused with advice to relay through a family member. An agent of
  another family does not exist as far as this one can tell (the same refusal
  as an unknown id), so other roots see nothing.
- Delivery is durable (the family store) and idempotent by delivery id: the
  same sender, delivery id and message again returns the first delivery; the
  same delivery id with another recipient or text is refused.
- Reading does not consume; only the recipient acknowledges (idempotently).
- Delivering wakes no model and draws nothing from the budget: it is one row.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from rlmfamily.family.errors import (
    FamilyArgumentInvalid,
    AckRefused,
    AgentNotFound,
    DeliveryConflict,
    InboxFull,
    MessageNotFound,
    MessageTooLarge,
    RouteRefused,
)
from rlmfamily.family.store import Agent, FamilyStore
from rlmfamily.settings import RLMSettings

MAX_DELIVERY_ID_CHARS = 200


def route_refusal(sender: Agent, recipient: Agent) -> str | None:
    """Why ``sender`` may not write to ``recipient`` (None: allowed)."""
    if recipient.agent_id == sender.agent_id:
        return "an agent does not message itself; keep the note in a variable"
    if recipient.agent_id == sender.parent_id or recipient.parent_id == sender.agent_id:
        return None
    if sender.parent_id is not None and recipient.parent_id == sender.parent_id:
        return None
    if recipient.agent_id.startswith(sender.agent_id + "."):
        kind, relay = "below your children (a grandchild or deeper)", "the child of yours above it"
    elif sender.agent_id.startswith(recipient.agent_id + "."):
        kind, relay = "above your parent", f"your parent {sender.parent_id}"
    else:
        kind = "a cousin" if recipient.depth == sender.depth else "not your parent, child or sibling"
        relay = f"your parent {sender.parent_id}"
    return (f"{recipient.agent_id} is {kind}; messages reach only your parent, direct children and siblings. "
            f"Relay through a family member ({relay}) who can reach it")


class Inbox:
    """One agent's view of its family's messages."""

    def __init__(self, store: FamilyStore, settings: RLMSettings, root_id: str, agent_id: str) -> None:
        self.store = store
        self.settings = settings
        self.root_id = root_id
        self.agent_id = agent_id

    def _agent(self, agent_id: str) -> Agent:
        agent = self.store.agent(str(agent_id))
        if agent is None or agent.root_id != self.root_id:
            raise AgentNotFound(f"no agent {agent_id!r} in this family; rlm.parent_id() and rlm.children() "
                                "name the agents you can reach")
        return agent

    def parent_id(self) -> str | None:
        return self._agent(self.agent_id).parent_id

    def send(self, to: str, text: str, delivery_id: str | None = None) -> dict[str, Any]:
        """Deliver ``text`` to ``to``; returns ``{id, delivery_id, to, duplicate}``."""
        if not isinstance(text, str):
            raise FamilyArgumentInvalid("rlm.message(to, text): text must be a string")
        limit = self.settings.max_message_chars
        if len(text) > limit:
            raise MessageTooLarge(f"the message is {len(text):,} characters; at most {limit:,} are accepted "
                                  "(RLM_MAX_MESSAGE_CHARS). Send a summary, or write a file and send its path",
                                  setting="max_message_chars")
        if delivery_id is not None and (not isinstance(delivery_id, str) or not delivery_id
                                        or len(delivery_id) > MAX_DELIVERY_ID_CHARS):
            raise FamilyArgumentInvalid(f"delivery_id must be a non-empty string of at most {MAX_DELIVERY_ID_CHARS} characters")
        sender = self._agent(self.agent_id)
        recipient = self._agent(str(to))
        refusal = route_refusal(sender, recipient)
        if refusal is not None:
            raise RouteRefused(refusal)
        given = delivery_id is not None
        delivery = delivery_id if given else "auto-" + secrets.token_hex(12)
        with self.store.transaction() as conn:
            row = conn.execute("SELECT id, recipient, body FROM messages WHERE root_id = ? AND sender = ? "
                               "AND delivery_id = ?", (self.root_id, sender.agent_id, delivery)).fetchone()
            if row is not None:
                if row["recipient"] != recipient.agent_id or row["body"] != text:
                    raise DeliveryConflict(
                        f"delivery id {delivery!r} was already used for message {row['id']} to {row['recipient']} "
                        "with other content; use a new delivery id for a new message"
                    )
                return {"id": row["id"], "delivery_id": delivery, "to": recipient.agent_id, "duplicate": True}
            stored = conn.execute("SELECT COUNT(*) FROM messages WHERE root_id = ?", (self.root_id,)).fetchone()[0]
            if stored >= self.settings.max_family_messages:
                raise InboxFull(f"this family already keeps {stored:,} messages; max_family_messages is "
                                f"{self.settings.max_family_messages:,} (RLM_MAX_FAMILY_MESSAGES)",
                                setting="max_family_messages")
            cursor = conn.execute(
                "INSERT INTO messages (root_id, sender, recipient, delivery_id, body, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (self.root_id, sender.agent_id, recipient.agent_id, delivery, text, time.time()),
            )
            return {"id": int(cursor.lastrowid or 0), "delivery_id": delivery, "to": recipient.agent_id,
                    "duplicate": False}

    def read(self, limit: int = 20, *, include_acked: bool = False) -> list[dict[str, Any]]:
        """Messages to this agent, oldest first; unacknowledged ones unless ``include_acked``. Reading consumes nothing."""
        cap = self.settings.max_inbox_read
        limit = max(1, min(int(limit), cap))
        sql = "SELECT * FROM messages WHERE root_id = ? AND recipient = ?"
        if not include_acked:
            sql += " AND acked_at IS NULL"
        with self.store.reading() as conn:
            rows = conn.execute(sql + " ORDER BY id LIMIT ?", (self.root_id, self.agent_id, limit)).fetchall()
        return [_message(r) for r in rows]

    def ack(self, message_id: int) -> dict[str, Any]:
        """Acknowledge a message to this agent (again: no change); another agent's message is refused."""
        with self.store.transaction() as conn:
            row = conn.execute("SELECT * FROM messages WHERE id = ? AND root_id = ?",
                               (int(message_id), self.root_id)).fetchone()
            if row is None:
                raise MessageNotFound(f"no message {message_id} in this family; rlm.inbox() lists yours")
            if row["recipient"] != self.agent_id:
                raise AckRefused(f"message {message_id} is addressed to {row['recipient']}; only its recipient "
                                 "acknowledges it")
            if row["acked_at"] is None:
                conn.execute("UPDATE messages SET acked_at = ? WHERE id = ?", (time.time(), row["id"]))
                row = conn.execute("SELECT * FROM messages WHERE id = ?", (row["id"],)).fetchone()
        return _message(row)


def family_messages(store: FamilyStore, root_id: str, *, agent_id: str | None = None,
                    limit: int = 100) -> list[dict[str, Any]]:
    """Every message of a family (or those from or to ``agent_id``), oldest first: the operator's view."""
    sql = "SELECT * FROM messages WHERE root_id = ?"
    args: list[Any] = [root_id]
    if agent_id is not None:
        sql += " AND (recipient = ? OR sender = ?)"
        args += [agent_id, agent_id]
    with store.reading() as conn:
        return [_message(r) for r in conn.execute(sql + " ORDER BY id LIMIT ?", (*args, int(limit)))]


def _message(row: Any) -> dict[str, Any]:
    return {"id": row["id"], "from": row["sender"], "to": row["recipient"], "text": row["body"],
            "delivery_id": row["delivery_id"], "sent_at": row["created_at"], "acked": row["acked_at"] is not None}
