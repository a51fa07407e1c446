"""Errors of families: children (admission, handles, follow-ups) and the family inbox.

Each has a stable ``code``; an admission error names the setting that raises the
limit. Inside the sandbox they arrive as ``ValueError("[code] message")``.
"""

from __future__ import annotations

from rlmfamily.errors import RLMError


class FamilyError(RLMError):
    code = "family_error"


class FamilyArgumentInvalid(FamilyError):
    """A call of the family's API with a missing or mistyped argument (a prompt, a message, a delivery id)."""

    code = "family_argument_invalid"


class ChildDepthExceeded(FamilyError):
    code = "child_depth_exceeded"


class ChildLimitReached(FamilyError):
    code = "child_limit_reached"


class ParallelChildLimitReached(FamilyError):
    code = "parallel_child_limit_reached"


class ChildPromptTooLarge(FamilyError):
    code = "child_prompt_too_large"


class ChildrenUnavailable(FamilyError):
    """A child cannot be started here (a provider or context that cannot be rebuilt in another process)."""

    code = "children_unavailable"


class ChildNotFound(FamilyError):
    code = "child_not_found"


class ChildNotCompleted(FamilyError):
    code = "child_not_completed"


class FamilyNotFound(FamilyError):
    code = "family_not_found"


class AgentNotFound(FamilyError):
    code = "agent_not_found"


class RouteRefused(FamilyError):
    code = "route_refused"


class DeliveryConflict(FamilyError):
    code = "delivery_id_conflict"


class MessageTooLarge(FamilyError):
    code = "message_too_large"


class InboxFull(FamilyError):
    code = "inbox_full"


class MessageNotFound(FamilyError):
    code = "message_not_found"


class AckRefused(FamilyError):
    code = "ack_refused"
