"""The SQS bridge: Step Functions executions ask Turnstile through an SQS queue.

An execution sends a JSON message with ``sqs:sendMessage.waitForTaskToken`` (to wait for
its grant without polling) or ``sqs:sendMessage`` (to release). The bridge long-polls the
queue (20 s, up to 10 messages), records each message on the store, then deletes it; its
in-process :class:`~turnstile.workflows.deliverer.Deliverer` resumes each execution with
``SendTaskSuccess`` the moment its turn comes. ``turnstile bridge sqs QUEUE_URL`` runs one.

Messages (``docs/workflows.md`` has the full table)::

    {"action": "acquire", "name", "limit"?=1, "ttl"?=30, "holder", "task_token", "wait_ttl"?,
     "priority"?=0, "ageing"?}
    {"action": "try",     "name", "limit"?=1, "ttl"?=30, "holder", "task_token", "wait_ttl"?,
     "priority"?=0, "ageing"?}
    {"action": "release", "name", "holder", "token"?, "task_token"?}
    {"action": "ack",     "queue", "id", "receipt", "task_token"?}
    {"action": "nack",    "queue", "id", "receipt", "error"?, "delay"?, "task_token"?}

plus EventBridge "Step Functions Execution Status Change" events (an ended execution's
grants and places are freed: :mod:`.lifecycle`).

Rules:

* **Delete after recording.** A message is deleted only once the store has recorded it;
  every action is idempotent per holder (or per receipt), so a message delivered again
  (the bridge died before deleting it, the visibility timeout passed) does no harm.
* **A bad message never stops the bridge.** One that carries a ``task_token`` is answered
  with ``SendTaskFailure(error="turnstile.InvalidArgument", cause=<what is wrong>)`` (so the
  execution fails at once instead of waiting); any other is logged once per kind (never its
  body: it may hold a task token) and deleted. Set a redrive policy on the queue anyway.
* **Store unavailable:** the message is not deleted (SQS delivers it again after the
  queue's visibility timeout) and the bridge backs off, up to 30 s.
* **Order:** asks are granted in the order the bridge receives them. On AWS that is strict
  only with an SQS FIFO queue (the ASL passes ``MessageGroupId``, e.g. the name); a standard
  queue is best effort (it may reorder messages sent close together).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._async.client import AsyncClient
from .._core import callbacks, validate
from ..errors import (
    BackendUnavailable,
    ConfigurationError,
    InvalidArgument,
    TurnstileError,
)
from . import aws, lifecycle, threads
from .deliverer import DEFAULT_CLAIM, Deliverer
from .reconciler import DEFAULT_INTERVAL, Reconciler

log = logging.getLogger("turnstile.bridge")

WAIT_SECONDS = 20  # SQS long poll (its maximum)
MAX_MESSAGES = 10  # per ReceiveMessage (its maximum)
MAX_BACKOFF = 30.0
DEFAULT_TTL = 30.0
ERROR_PREFIX = "turnstile."

FIELDS: dict[str, tuple[set[str], set[str]]] = {
    # action: (required, optional) besides "action"
    "acquire": (
        {"name", "holder", "task_token"},
        {"limit", "ttl", "wait_ttl", "priority", "ageing"},
    ),
    "try": ({"name", "holder", "task_token"}, {"limit", "ttl", "wait_ttl", "priority", "ageing"}),
    "release": ({"name", "holder"}, {"token", "task_token"}),
    "ack": ({"queue", "id", "receipt"}, {"task_token"}),
    "nack": ({"queue", "id", "receipt"}, {"error", "delay", "task_token"}),
}


class BadMessage(Exception):
    """A message the bridge can never act on: answered (SendTaskFailure) and deleted."""

    def __init__(self, cause: str, error: str = "InvalidArgument") -> None:
        super().__init__(cause)
        self.cause = cause
        self.error = ERROR_PREFIX + error


class Retry(Exception):
    """Not recorded now (the store or AWS is unavailable): keep the message for later."""


@dataclass
class BridgeStats:
    received: int = 0
    recorded: int = 0
    bad: int = 0
    events: int = 0
    retried: int = 0
    deleted: int = 0


def _task_token(body: dict[str, Any]) -> str | None:
    token = body.get("task_token")
    if isinstance(token, str) and 0 < len(token) <= callbacks.MAX_TASK_TOKEN_CHARS:
        return token
    return None


class Bridge:
    """One SQS queue feeding one store. :meth:`run` until ``stop`` is set; or call
    :meth:`handle` with a message body (tests, other transports)."""

    def __init__(
        self,
        client: AsyncClient,
        queue_url: str,
        *,
        deliver: bool = True,
        reconcile_interval: float = DEFAULT_INTERVAL,
        wait_ttl: float | None = None,
        claim: float = DEFAULT_CLAIM,
        wait_seconds: int = WAIT_SECONDS,
    ) -> None:
        if not isinstance(queue_url, str) or not queue_url.startswith(("https://", "http://")):
            raise InvalidArgument("QUEUE_URL must be an SQS queue URL (https://sqs.…)")
        self.client = client
        self.queue_url = queue_url
        self.wait_ttl = None if wait_ttl is None else validate.ttl(wait_ttl, "wait_ttl")
        self.wait_seconds = wait_seconds
        self.deliverer: Deliverer | None = None
        if deliver and client.characteristics.local_deliveries:
            self.deliverer = Deliverer(client.backend, claim=claim)
        self.reconciler: Reconciler | None = None
        if reconcile_interval:
            self.reconciler = Reconciler(client, interval=reconcile_interval, on_release=self.nudge)
        self.stats = BridgeStats()
        self.fifo = queue_url.endswith(".fifo")
        self._warned: set[str] = set()

    # -- running ------------------------------------------------------------------------

    def nudge(self) -> None:
        if self.deliverer is not None:
            self.deliverer.nudge()

    async def check_queue(self) -> dict[str, str]:
        """GetQueueAttributes: fails at once, naming the fix, if the queue cannot be used."""
        try:
            found = await threads.call(
                aws.client("sqs").get_queue_attributes,
                QueueUrl=self.queue_url,
                AttributeNames=["FifoQueue", "VisibilityTimeout"],
            )
        except ConfigurationError:
            raise
        except Exception as exc:
            code = aws.error_code(exc)
            if code is None and type(exc).__name__ in (
                "EndpointConnectionError",
                "ConnectTimeoutError",
            ):
                raise BackendUnavailable(f"cannot reach SQS: {exc}") from None
            raise ConfigurationError(
                f"cannot use queue {self.queue_url}: {code or type(exc).__name__}: {exc}"
            ) from None
        attributes: dict[str, str] = found.get("Attributes", {})
        self.fifo = attributes.get("FifoQueue") == "true"
        return attributes

    async def run(self, stop: asyncio.Event) -> None:
        """Receive and record messages until ``stop`` is set; the deliverer and reconciler
        run alongside. Stops promptly: a long poll in flight is abandoned (its messages, if
        any, are delivered again after the queue's visibility timeout)."""
        if self.deliverer is not None:
            await self.deliverer.start()
        if self.reconciler is not None:
            await self.reconciler.start()
        failures = 0
        try:
            while not stop.is_set():
                receiving = asyncio.ensure_future(threads.call(self._receive))
                stopping = asyncio.ensure_future(stop.wait())
                await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                if not receiving.done():
                    receiving.cancel()
                    break
                try:
                    messages = receiving.result()
                except Exception as exc:
                    failures += 1
                    self._warn("receive", f"cannot receive from SQS: {_aws_text(exc)}")
                    await _sleep_unless(stop, min(MAX_BACKOFF, 0.5 * 2**failures))
                    continue
                kept = await self.process(messages)
                failures = failures + 1 if kept else 0
                if kept:
                    await _sleep_unless(stop, min(MAX_BACKOFF, 0.5 * 2**failures))
        finally:
            if self.reconciler is not None:
                await self.reconciler.stop()
            if self.deliverer is not None:
                await self.deliverer.stop()

    def _receive(self) -> list[dict[str, Any]]:
        found = aws.client("sqs").receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=MAX_MESSAGES,
            WaitTimeSeconds=self.wait_seconds,
        )
        messages: list[dict[str, Any]] = found.get("Messages", [])
        return messages

    async def process(self, messages: list[dict[str, Any]]) -> int:
        """Record ``messages`` in order and delete those recorded; returns how many were
        kept for SQS to deliver again (the store or AWS was unavailable)."""
        done: list[dict[str, Any]] = []
        kept = 0
        for index, message in enumerate(messages):
            self.stats.received += 1
            try:
                await self.handle(message.get("Body", ""), message.get("MessageId", "?"))
            except Retry as exc:
                # Keep this one and the rest (in a FIFO group they must stay behind it).
                kept = len(messages) - index
                self.stats.retried += kept
                self._warn("retry", f"message kept for redelivery: {exc}")
                break
            done.append(message)
        if done:
            await self._delete(done)
        return kept

    async def _delete(self, messages: list[dict[str, Any]]) -> None:
        entries = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
        ]
        try:
            answer = await threads.call(
                aws.client("sqs").delete_message_batch, QueueUrl=self.queue_url, Entries=entries
            )
        except Exception as exc:
            # Recorded but not deleted: delivered again later, which is harmless.
            self._warn("delete", f"cannot delete messages: {_aws_text(exc)}")
            return
        self.stats.deleted += len(answer.get("Successful", []))
        if answer.get("Failed"):
            self._warn("delete", f"{len(answer['Failed'])} message(s) not deleted")

    # -- one message --------------------------------------------------------------------

    async def handle(self, text: str, message_id: str = "?") -> None:
        """Record one message body. Raises :class:`Retry` when it must stay in the queue;
        anything else (bad messages included) is done with."""
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if lifecycle.is_status_change(body):
            await self._event(body)
            return
        token = _task_token(body) if isinstance(body, dict) else None
        try:
            await self._act(body)
            self.stats.recorded += 1
        except BadMessage as exc:
            self.stats.bad += 1
            await self._refuse(exc, token, message_id, body)
        except BackendUnavailable as exc:
            raise Retry(f"store unavailable: {exc}") from None
        except TurnstileError as exc:  # LimitConflict, NotSupported, InvalidArgument...
            self.stats.bad += 1
            await self._refuse(BadMessage(str(exc), type(exc).__name__), token, message_id, body)
        except Retry:
            raise
        except Exception as exc:  # a bug: fail the execution rather than loop on the message
            self.stats.bad += 1
            cause = f"internal error ({type(exc).__name__}); please report it"
            await self._refuse(BadMessage(cause, "InternalError"), token, message_id, body)

    async def _event(self, event: dict[str, Any]) -> None:
        """A status-change event: free an ended execution. It never stops the bridge: only
        an unavailable store keeps it for redelivery; anything else is logged and dropped
        (an event carries no task token to fail)."""
        self.stats.events += 1
        arn = lifecycle.ended_execution(event)
        if arn is None:
            return  # RUNNING, or not ours to read: nothing to do
        try:
            freed = await lifecycle.free_execution(self.client, arn)
        except BackendUnavailable as exc:
            raise Retry(f"store unavailable: {exc}") from None
        except Exception as exc:  # a bad ARN, a refused name: never a crash loop
            self.stats.bad += 1
            self._warn("event", f"status-change event dropped: {type(exc).__name__}: {exc}")
            return
        if freed.anything:
            self.nudge()

    async def _act(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise BadMessage("the message body must be a JSON object with an 'action'")
        action = body.get("action")
        if action not in FIELDS:
            raise BadMessage(f"action must be one of {', '.join(map(repr, FIELDS))}")
        required, optional = FIELDS[action]
        missing = sorted(required - set(body))
        if missing:
            raise BadMessage(f"{action} needs {', '.join(map(repr, missing))}")
        unknown = sorted(set(body) - required - optional - {"action"})
        if unknown:
            raise BadMessage(f"{action} has unknown field(s): {', '.join(map(repr, unknown))}")
        if "task_token" in body and _task_token(body) is None:
            raise BadMessage(
                f"task_token must be a string of 1 to {callbacks.MAX_TASK_TOKEN_CHARS} characters"
            )
        try:
            await getattr(self, "_" + action)(body)
        except InvalidArgument as exc:
            raise BadMessage(str(exc)) from None

    def _semaphore(self, body: dict[str, Any]) -> Any:
        return self.client.semaphore(
            body["name"],
            body.get("limit", 1),
            body.get("ttl", DEFAULT_TTL),
            priority=body.get("priority", 0),
            ageing=body.get("ageing"),
        )

    def _wait(self, body: dict[str, Any], default: float | None) -> float | None:
        if "wait_ttl" in body:
            return validate.ttl(body["wait_ttl"], "wait_ttl")
        return self.wait_ttl if self.wait_ttl is not None else default

    async def _acquire(self, body: dict[str, Any]) -> None:
        semaphore = self._semaphore(body)
        callback = callbacks.check(
            callbacks.StepFunctionsCallback(body["task_token"]), "task_token"
        )
        await semaphore.try_acquire(
            validate.holder(body["holder"]), self._wait(body, None), callback=callback
        )
        self.nudge()  # granted at once, or later by a release: the deliverer sends it

    async def _try(self, body: dict[str, Any]) -> None:
        semaphore = self._semaphore(body)
        ticket = await semaphore.try_acquire(
            validate.holder(body["holder"]), self._wait(body, semaphore.ttl)
        )
        lease = ticket.lease
        answer: dict[str, Any] = {
            "acquired": ticket.acquired,
            "position": ticket.position,
            "retry_after": ticket.retry_after,
            "lease": None
            if lease is None
            else callbacks.lease_document(
                lease.name, lease.holder, lease.token, lease.expires_at, semaphore.limit
            ),
        }
        await self._answer(body["task_token"], answer)

    async def _release(self, body: dict[str, Any]) -> None:
        semaphore = self.client.semaphore(body["name"], 1)
        token = validate.token(body.get("token"))
        released = await semaphore.release(validate.holder(body["holder"]), token)
        self.nudge()  # the next in line may be a callback waiter
        if "task_token" in body:
            await self._answer(body["task_token"], {"released": released})

    async def _ack(self, body: dict[str, Any]) -> None:
        acked = await self.client.queue(body["queue"]).ack(body["id"], body["receipt"])
        if "task_token" in body:
            await self._answer(body["task_token"], {"acked": acked})

    async def _nack(self, body: dict[str, Any]) -> None:
        nacked = await self.client.queue(body["queue"]).nack(
            body["id"], body["receipt"], delay=body.get("delay", 0.0), error=body.get("error")
        )
        if "task_token" in body:
            await self._answer(body["task_token"], {"nacked": nacked})

    # -- answers to executions ----------------------------------------------------------

    async def _answer(self, task_token: str, output: dict[str, Any]) -> None:
        """SendTaskSuccess of a confirmation. Recorded already: a token that can never be
        answered (used by an earlier delivery of this message, execution gone) is fine; a
        transient failure keeps the message, whose action is idempotent."""
        text = json.dumps(output, separators=(",", ":"))
        try:
            await threads.call(
                aws.client("stepfunctions").send_task_success, taskToken=task_token, output=text
            )
        except Exception as exc:
            code = aws.error_code(exc)
            if code in aws.PERMANENT_TASK_ERRORS:
                return
            raise Retry(f"cannot answer the execution: {_aws_text(exc)}") from None

    async def _refuse(
        self, exc: BadMessage, task_token: str | None, message_id: str, body: Any
    ) -> None:
        action = body.get("action") if isinstance(body, dict) else None
        what = action if isinstance(action, str) and action in FIELDS else "message"
        if task_token is None:
            self._warn(
                f"bad:{exc.cause}", f"dropped a bad {what} (SQS message {message_id}): {exc.cause}"
            )
            return
        log.info("refused a %s (SQS message %s): %s", what, message_id, exc.cause)
        try:
            await threads.call(
                aws.client("stepfunctions").send_task_failure,
                taskToken=task_token,
                error=exc.error,
                cause=exc.cause[:32_768],
            )
        except Exception as failure:
            self._warn("refuse", f"cannot fail the execution of a bad {what}: {_aws_text(failure)}")

    def _warn(self, key: str, message: str) -> None:
        """Log a problem once per kind (quiet logs on a bad day); later ones at debug."""
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)
        else:
            log.debug("%s", message)


def _aws_text(exc: BaseException) -> str:
    code = aws.error_code(exc)
    return f"{code}" if code else f"{type(exc).__name__}: {exc}"


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()


async def serve(
    client: AsyncClient,
    queue_url: str,
    *,
    on_ready: Callable[[Bridge], None] | None = None,
    **options: Any,
) -> Bridge:
    """Run a bridge until SIGTERM or SIGINT (the command line's loop). Signals already
    ignored stay ignored."""
    bridge = Bridge(client, queue_url, **options)
    await bridge.check_queue()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(signum) == signal.SIG_IGN:
            continue
        loop.add_signal_handler(signum, stop.set)
        installed.append(signum)
    if on_ready is not None:
        on_ready(bridge)
    started = time.monotonic()
    try:
        await bridge.run(stop)
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
    log.debug("bridge ran %.1f s", time.monotonic() - started)
    return bridge
