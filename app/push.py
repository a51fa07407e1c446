"""The edge's side of A2A push notifications: a configuration checked as it arrives, and the config methods.

A configuration arrives in SendMessage (``configuration.taskPushNotificationConfig``, stored by admission in
the send's transaction, before the task's first event) or through the config methods (Create, Get, List,
Delete on every binding; ``EdgeRequestHandler`` calls ``PushConfigs``). ``check_config`` refuses what the
service will not call (``core.webhooks``: https only, no private, loopback, link-local or metadata address,
by literal and by what the host resolves to now; a name that does not resolve yet is accepted and checked
again at every delivery) and fields over their limits. Every read and write is scoped by the task's owner:
another customer's task or configuration is ``TaskNotFound`` (A2A's ``TaskNotFoundError``), exactly like one that does not exist.
Anonymous callers cannot register (``key_required_for_push``): their tasks are reachable by id alone.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from a2a.types.a2a_pb2 import AuthenticationInfo, TaskPushNotificationConfig
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import InvalidValue, KeyRequiredForPush, PushConfigCap, PushNotificationNotSupported, TaskNotFound
from app.identity import Identity
from core.settings import Settings
from core.webhooks import WebhookRefused, check_url, resolve_checked
from taskstate import push, rows

_PRINTABLE = frozenset(chr(code) for code in range(0x21, 0x7F))


@dataclass(frozen=True)
class PushRequest:
    """A configuration as checked, before it names its task (SendMessage's is for a task not yet created)."""

    config_id: str  # "" : the task's id, as the a2a-sdk's stores default it
    url: str
    token: str | None
    auth_scheme: str | None
    auth_credentials: str | None

    def for_task(self, task_id: str) -> push.Config:
        return push.Config(task_id=task_id, config_id=self.config_id or task_id, url=self.url, token=self.token,
                           auth_scheme=self.auth_scheme, auth_credentials=self.auth_credentials)


def _field(name: str, value: str, limit: int, setting: str, *, printable: bool = False) -> None:
    if len(value) > limit:
        raise InvalidValue(f"{name} has {len(value)} characters; at most {limit} are accepted ({setting})",
                           code="push_config_invalid")
    if printable and not set(value) <= _PRINTABLE:
        raise InvalidValue(f"{name} must be printable ASCII without spaces", code="push_config_invalid")


def check_config(config: TaskPushNotificationConfig, settings: Settings) -> PushRequest:
    """The configuration's form (no resolution): raise the first problem, naming the field and the setting."""
    if not settings.push.enabled:
        raise PushNotificationNotSupported("this service does not send push notifications")
    limits = settings.push
    _field("id", config.id, push.MAX_CONFIG_ID_CHARS, "at most 64 characters", printable=True)
    _field("token", config.token, limits.max_token_chars, "SPECIALISTS_PUSH_MAX_TOKEN_CHARS")
    auth = config.authentication
    _field("authentication.scheme", auth.scheme, 64, "at most 64 characters", printable=True)
    _field("authentication.credentials", auth.credentials, limits.max_credentials_chars,
           "SPECIALISTS_PUSH_MAX_CREDENTIALS_CHARS")
    if any(c in auth.credentials or c in config.token for c in "\r\n\x00"):
        raise InvalidValue("token and credentials must not hold line breaks or NUL", code="push_config_invalid")
    try:
        check_url(config.url, allow_loopback=limits.allow_loopback, max_chars=limits.max_url_chars)
    except WebhookRefused as refused:
        raise InvalidValue(refused.message, code=refused.code) from None
    return PushRequest(config_id=config.id, url=config.url, token=config.token or None,
                       auth_scheme=auth.scheme or None, auth_credentials=auth.credentials or None)


async def check_reachable(request: PushRequest, settings: Settings) -> None:
    """Refuse a host that resolves, now, to an address the service will not call (checked again at delivery)."""
    limits = settings.push
    target = check_url(request.url, allow_loopback=limits.allow_loopback, max_chars=limits.max_url_chars)
    try:
        await asyncio.to_thread(resolve_checked, target, allow_loopback=limits.allow_loopback,
                                timeout_s=limits.resolve_timeout_s)
    except WebhookRefused as refused:
        if refused.code == "webhook_unresolved":
            return  # nothing to judge yet: every delivery resolves and checks again
        raise InvalidValue(refused.message, code=refused.code) from None


def require_key(identity: Identity) -> str:
    if identity.customer_id is None:
        raise KeyRequiredForPush("push notifications need an API key: without one, a task is reachable by its id alone")
    return identity.customer_id


def cap_refusal(max_configs: int, held: int) -> PushConfigCap:
    return PushConfigCap(
        f"you hold {held} push configurations on tasks that have not ended; at most "
        f"{max_configs} are accepted (SPECIALISTS_PUSH_MAX_CONFIGS_PER_CUSTOMER): delete "
        "one, or wait for a task to end"
    )


def to_proto(config: push.Config) -> TaskPushNotificationConfig:
    proto = TaskPushNotificationConfig(id=config.config_id, task_id=config.task_id, url=config.url)
    if config.token:
        proto.token = config.token
    if config.auth_scheme:
        # Credentials are the client's secret for its own webhook: never read back.
        proto.authentication.CopyFrom(AuthenticationInfo(scheme=config.auth_scheme))
    return proto


class PushConfigs:
    """The config methods on the database (each one short transaction), scoped by the task's owner."""

    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings

    async def create(self, params: TaskPushNotificationConfig, identity: Identity, owner: str) -> TaskPushNotificationConfig:
        customer_id = require_key(identity)
        request = check_config(params, self.settings)
        await check_reachable(request, self.settings)
        config = request.for_task(params.task_id)
        async with self.engine.begin() as conn:
            if not await conn.run_sync(rows.owns, params.task_id, owner):
                raise TaskNotFound("Task not found")
            try:
                stored = await conn.run_sync(
                    lambda sync: push.insert_config(sync, config, owner=owner, customer_id=customer_id,
                                                    max_per_customer=self.settings.push.max_configs_per_customer))
            except push.TooManyConfigs as over:
                raise cap_refusal(self.settings.push.max_configs_per_customer, over.held) from None
        if not stored:
            raise TaskNotFound("Task not found")
        return to_proto(config)

    async def get(self, task_id: str, config_id: str, owner: str) -> TaskPushNotificationConfig:
        async with self.engine.connect() as conn:
            found = await conn.run_sync(push.get_config, task_id, config_id, owner)
        if found is None:
            raise TaskNotFound("no push configuration of yours has this task and id")
        return to_proto(found)

    async def list(self, task_id: str, owner: str) -> list[TaskPushNotificationConfig]:
        async with self.engine.connect() as conn:
            if not await conn.run_sync(rows.owns, task_id, owner):
                raise TaskNotFound("Task not found")
            found = await conn.run_sync(
                lambda sync: push.list_configs(sync, task_id, owner, limit=self.settings.push.max_configs_per_customer))
        return [to_proto(config) for config in found]

    async def delete(self, task_id: str, config_id: str, owner: str) -> None:
        """Idempotent (spec 3.1.10): a configuration already gone answers success, as long as the task is the
        caller's; another customer's task, or none, is ``TaskNotFound``."""
        async with self.engine.begin() as conn:
            deleted = await conn.run_sync(push.delete_config, task_id, config_id, owner)
            if not deleted and not await conn.run_sync(rows.owns, task_id, owner):
                raise TaskNotFound("Task not found")
