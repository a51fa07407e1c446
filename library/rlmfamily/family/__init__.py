"""Families of sessions: children (``rlm.run``, handles, follow-ups, restart recovery) and the family inbox.

A root run and the children it starts form a family that shares the root's one
inference budget. Children run in their own OS processes; their records and the
family's messages are durable (``family.sqlite3`` beside the budget and the
history). See docs/RLM.md ("Children and the family inbox").
"""

from rlmfamily.family.children import Family, summary
from rlmfamily.family.inbox import Inbox
from rlmfamily.family.store import Agent, FamilyStore, RunRecord

__all__ = ["Agent", "Family", "FamilyStore", "Inbox", "RunRecord", "summary"]
