"""What a ``SendMessage`` does, in a worker thread (the client's functions are blocking):
start a run, or answer the waits of a suspended one; and a task's push config, which is
its run's webhook. Every check runs before the first write, and each refusal is the
protocol's error, so a refused message stores nothing.

- No ``taskId``: a new run of the agent, its input the message's text parts joined; on
  the Root named by ``contextId`` (one of the caller's), or a new Root without one. The
  ``messageId`` is the run's idempotency key, so a client that sends a message again
  (a retry after a lost answer) gets the same task, not a second run.
- A ``taskId``: the answers of ``worker.api.a2a.answers`` to the task's waits.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from uuid import UUID

import structlog
from a2a.types.a2a_pb2 import Message, Role, SendMessageRequest, TaskPushNotificationConfig
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InvalidParamsError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from runtime.errors import RequestInvalid
from schema.store import events as event_store
from schema.store.errors import AgentNotFound, IdempotencyKeyReused, RootNotFound
from schema.store.suspensions import DeliveryRefused
from schema.wire import RunStatus, RunView
from worker import client
from worker.api.a2a.answers import ReplyInvalid, apply, check_waited_for, replies_of
from worker.client.context import ClientContext
from worker.ops.webhooks.policy import WebhookRefused, check_webhook_url, url_origin

log = structlog.get_logger("aidawork.api")
PUSH_CONFIG_ID = "webhook"  # a run has one webhook: its task has one push config, of this id
_PUSH_FIELD = "configuration.taskPushNotificationConfig"


@dataclass(frozen=True)
class Started:
    """What a message set going: the run, the seq its stream follows from, and whether
    it goes on (False: an answer that was not the last one its round waits for)."""

    run_id: UUID
    after_seq: int
    follow: bool = True


def invalid(field: str, message: str, code: str | None = None) -> InvalidParamsError:
    data = {"field": field} if code is None else {"field": field, "code": code}
    return InvalidParamsError(message=f"{field}: {message}", data=data)


def check_role(message: Message) -> None:
    if message.role == Role.ROLE_AGENT:
        raise invalid("message.role", "a client sends ROLE_USER messages")


def input_of(message: Message) -> str:
    """A new task's input: the message's text parts, joined by newlines."""
    texts = []
    for i, part in enumerate(message.parts):
        content = part.WhichOneof("content")
        if content == "data":
            raise invalid(f"message.parts[{i}]", "a data part answers a task's wait: send it with the taskId")
        if content != "text":
            raise ContentTypeNotSupportedError(message=f"message.parts[{i}]: only text parts start a task")
        texts.append(part.text)
    text = "\n".join(texts)
    if not text.strip():
        raise invalid("message.parts", "send the task's input as a text part")
    return text


def push_url(config: TaskPushNotificationConfig, field: str, prefixes: list[str]) -> str:
    """The URL of a push config, checked as a run's webhook is. Deliveries are signed
    (``AIDAWORK-Signature``), so a token or an authentication scheme, which the outbox
    would not send, is refused rather than silently dropped."""
    if config.token or config.HasField("authentication"):
        raise invalid(field, "token and authentication are not supported: deliveries are signed (AIDAWORK-Signature, "
                      "verify with the owner's webhook secret)")
    try:
        check_webhook_url(config.url, prefixes)
    except WebhookRefused as exc:
        raise invalid(f"{field}.url", exc.reason, exc.code) from None
    return config.url


def _idempotency_key(agent: str, message_id: str) -> str:
    # A messageId is any string: its digest fits the key's alphabet and length.
    return "a2a-" + hashlib.sha256(f"{agent}\0{message_id}".encode()).hexdigest()


def _root_of(message: Message) -> str | None:
    if not message.context_id:
        return None
    try:
        return str(UUID(message.context_id))
    except ValueError:
        raise invalid("message.contextId", "no such context") from None


def submit(ctx: ClientContext, owner: str, agent: str, params: SendMessageRequest) -> Started:
    """A new run of ``agent`` (``NAME@VERSION``) for the message."""
    message = params.message
    request: dict[str, object] = {
        "owner": owner,
        "agent": agent,
        "input": input_of(message),
        "root_id": _root_of(message),
        "idempotency_key": _idempotency_key(agent, message.message_id),
    }
    if params.configuration.HasField("task_push_notification_config"):
        config = params.configuration.task_push_notification_config
        request["webhook"] = {"url": push_url(config, _PUSH_FIELD, ctx.settings.webhook_prefixes)}
    try:
        submitted = client.submit(request, ctx=ctx)
    except RootNotFound:
        raise invalid("message.contextId", "no such context") from None
    except IdempotencyKeyReused:
        raise invalid("message.messageId", "was sent before with another message; send a new messageId") from None
    except AgentNotFound:  # deleted since the request was routed
        raise invalid("agent", "no such agent") from None
    except RequestInvalid as exc:  # the input too long, a URL refused (WebhookRefused), ...
        raise invalid("message.parts" if exc.field == "input" else exc.field, exc.reason, exc.code) from None
    log.info("a2a_task_submitted", run_id=str(submitted.run_id), agent=agent, replayed=submitted.existing)
    return Started(submitted.run_id, 0)


def answer(ctx: ClientContext, owner: str, view: RunView, params: SendMessageRequest) -> Started:
    """Answer the waits of ``view``'s run (a task of ``owner``'s) with the message's data parts."""
    message, run_id = params.message, view.run_id
    if message.context_id and message.context_id != str(view.root_id):
        raise invalid("message.contextId", "is not the context of this task")
    if view.status.terminal:
        raise UnsupportedOperationError(
            message=f"task {run_id} has ended ({view.status.value}): send the next message with its contextId "
            "and no taskId"
        )
    if view.status is not RunStatus.SUSPENDED:
        raise UnsupportedOperationError(message=f"task {run_id} is working: it takes input only when input-required")
    try:
        replies = replies_of(message)
        check_waited_for(replies, view.waiting_for)
    except ReplyInvalid as exc:
        raise invalid(exc.field, exc.message) from None
    url = None
    if params.configuration.HasField("task_push_notification_config"):
        url = push_url(params.configuration.task_push_notification_config, _PUSH_FIELD, ctx.settings.webhook_prefixes)
    after_seq = last_seq(ctx, run_id)
    if url is not None:
        set_push(ctx, owner, run_id, url)
    resuming = False
    for reply in replies:
        try:
            receipt = apply(ctx, run_id, reply)
        except RequestInvalid as exc:  # approved args, checked against the tool's schema
            raise invalid(f"{reply.where}.{exc.field}", exc.reason, exc.code) from None
        except DeliveryRefused as exc:  # answered by someone else since the check above
            raise invalid(f"{reply.where}.{exc.field}", exc.message, exc.code) from None
        resuming = resuming or bool(receipt.resumes)
    log.info("a2a_task_answered", run_id=str(run_id), answers=len(replies), resuming=resuming)
    return Started(run_id, after_seq, follow=resuming)


def last_seq(ctx: ClientContext, run_id: UUID) -> int:
    """The seq of the run's last event: a stream of what an answer sets going starts after it."""
    seq = 0
    while batch := event_store.read_events(ctx.engine, run_id, after_seq=seq):
        seq = batch[-1].seq
    return seq


def set_push(ctx: ClientContext, owner: str, run_id: UUID, url: str | None) -> None:
    """Set (None: remove) the webhook of ``owner``'s run; the URL was checked."""
    if not ctx.store.set_webhook(run_id, owner, url):
        if url is None:
            raise TaskNotFoundError
        raise UnsupportedOperationError(message=f"task {run_id} has ended: it sends no more notifications")
    if url is None:
        log.info("a2a_push_config_removed", run_id=str(run_id))
    else:
        log.info("a2a_push_config_set", run_id=str(run_id), target=url_origin(url))


def push_config(run_id: UUID, url: str) -> TaskPushNotificationConfig:
    return TaskPushNotificationConfig(task_id=str(run_id), id=PUSH_CONFIG_ID, url=url)
