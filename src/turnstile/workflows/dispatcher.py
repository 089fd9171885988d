"""The queue dispatcher: at most N AWS Step Functions executions at a time, from a keyed queue.

Pattern (a) of ``docs/workflows.md``. Work is put on a Turnstile keyed queue; a dispatcher
claims messages and starts one execution per message (``StartExecution``). The message stays
*in flight* while its execution runs (its visibility is extended, past the 12-hour limit of
one extension if need be), so the queue's own rules bound the executions:

* the queue's ``concurrency`` cap is ``max_running``: the store refuses a claim while N
  messages are in flight, across every dispatcher of the queue, so together they never have
  more than N executions running;
* one message per key in flight: the next message of a key starts only after the previous
  one's execution ended and its message was settled.

The dispatcher learns how an execution ended from ``DescribeExecution`` of its own running
executions (one call per execution per ``poll`` interval; never ``ListExecutions``):
SUCCEEDED acks the message; FAILED, TIMED_OUT or ABORTED nacks it (delivered again after a
backoff, a dead letter after ``max_attempts``). An execution may also settle its message
itself (the SQS bridge, with the receipt from its input): the dispatcher notices that its
extend or ack is refused and stops tracking it.

Executions are named after the delivery, deterministically (:func:`execution_name`):
``<message id>-<attempt>``. A dispatcher that dies (``kill -9``) leaves its messages in flight
until their visibility timeout passes; the next dispatcher to claim one (attempt > 1) first
describes the executions of the earlier attempts by their ARNs: one still RUNNING is adopted
(tracked, not started again), one that SUCCEEDED acks the message, otherwise the new attempt
starts. No message is started twice.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._async.backends.protocol import AsyncBackend
from .._async.client import AsyncClient
from .._async.queue import AsyncMessage, AsyncQueue
from .._core import timing, validate
from ..errors import BackendUnavailable, ConfigurationError, InvalidArgument, TurnstileError
from . import aws, threads

log = logging.getLogger("turnstile.dispatch")

DEFAULT_POLL = 2.0
DEFAULT_VISIBILITY = 300.0
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF = 1.0
DEFAULT_MAX_BACKOFF = 60.0
# Transient AWS errors (throttling, 5xx, the network): retried after this, doubling.
AWS_RETRY = 0.2
AWS_RETRY_MAX = 10.0
# Store errors while claiming: wait this long, doubling.
STORE_RETRY = 0.2
STORE_RETRY_MAX = 5.0
DESCRIBE_PARALLEL = 8

# StartExecution answers that no retry will change and that concern every message: the
# dispatcher stops (exits non-zero) rather than burn the messages' attempts.
FATAL_ERRORS = frozenset(
    {
        "StateMachineDoesNotExist",
        "StateMachineDeleting",
        "InvalidArn",
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "InvalidClientTokenId",
        "MissingAuthenticationToken",
        "ValidationException",
    }
)
# StartExecution answers that concern this message only: nacked with the error.
MESSAGE_ERRORS = frozenset({"InvalidExecutionInput", "InvalidName"})

NAME_CHARS = re.compile(r"^[A-Za-z0-9_-]+$")
HASHED = re.compile(r"--[0-9a-f]{24}$")
MAX_DIRECT_ID = 64  # longest message id used as is in an execution name
HASH_PREFIX = 36  # characters of a message id kept in front of its hash


def execution_name(message_id: str, attempt: int, generation: int = 1) -> str:
    """The execution name of one delivery: 1 to 80 characters of ``[A-Za-z0-9_-]``, the same
    for the same arguments, different for different ones.

    A message id of at most 64 such characters is used as is; any other id becomes its first
    36 characters (others replaced by ``_``), ``--`` and 24 hex digits of its SHA-256 (an id
    that already looks like that is hashed too, so no two ids share a name). Then
    ``-<attempt>``; a message put back from the dead letters (its attempts start again at 1)
    runs under ``-<attempt>-r<generation>`` from its second generation on."""
    attempt = int(attempt)
    if not 1 <= attempt <= validate.MAX_ATTEMPTS:
        raise InvalidArgument(f"attempt must be between 1 and {validate.MAX_ATTEMPTS}")
    direct = NAME_CHARS.match(message_id) and len(message_id) <= MAX_DIRECT_ID
    base = message_id if direct and not HASHED.search(message_id) else _hashed(message_id)
    name = f"{base}-{attempt}"
    if generation > 1:
        name += f"-r{generation}"
    return name


def _hashed(message_id: str) -> str:
    digest = hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    prefix = re.sub(r"[^A-Za-z0-9_-]", "_", message_id[:HASH_PREFIX])
    return f"{prefix}--{digest}"


def execution_arn(state_machine_arn: str, name: str) -> str:
    """``arn:…:stateMachine:M`` and a name -> ``arn:…:execution:M:name``."""
    parts = state_machine_arn.split(":")
    return ":".join([*parts[:5], "execution", parts[6], name])


def check_state_machine_arn(arn: str) -> str:
    parts = arn.split(":") if isinstance(arn, str) else []
    if len(parts) != 7 or parts[0] != "arn" or parts[2] != "states" or parts[5] != "stateMachine":
        raise InvalidArgument(
            f"not a state machine ARN (arn:aws:states:REGION:ACCOUNT:stateMachine:NAME, "
            f"without a version or alias): {arn!r}"
        )
    return arn


def execution_input(message: AsyncMessage, queue: str) -> str:
    """``{"payload": <body>, "turnstile": {queue, id, key, receipt, attempt}}``; a bytes
    payload is given as text (UTF-8) or base64 (``"encoding": "base64"``)."""
    meta: dict[str, Any] = {
        "queue": queue,
        "id": message.id,
        "key": message.key,
        "receipt": message.receipt,
        "attempt": message.attempt,
    }
    payload = message.payload
    if isinstance(payload, bytes):
        try:
            payload = payload.decode("utf-8")
        except UnicodeDecodeError:
            payload = base64.b64encode(payload).decode("ascii")
            meta["encoding"] = "base64"
    return json.dumps({"payload": payload, "turnstile": meta}, separators=(",", ":"))


class DispatchError(TurnstileError):
    """The dispatcher cannot go on: the state machine is missing, not ours to start, etc."""


@dataclass
class DispatchResult:
    """What one :meth:`Dispatcher.run` did."""

    started: int = 0  # StartExecution calls that started an execution
    adopted: int = 0  # running executions of earlier attempts, tracked instead of restarted
    acked: int = 0  # executions that SUCCEEDED (messages acked)
    nacked: int = 0  # executions that ended otherwise (messages nacked)
    settled_elsewhere: int = 0  # the receipt stopped working (the execution settled it...)
    describes: int = 0  # DescribeExecution calls while tracking running executions
    lookups: int = 0  # DescribeExecution calls looking for earlier attempts
    stopped_by: str | None = None
    errors: list[str] = field(default_factory=list)


@dataclass(eq=False)
class _Job:
    message: AsyncMessage
    name: str = ""
    arn: str | None = None
    started: float = 0.0  # local monotonic time it started or was adopted
    next_extend: float = 0.0
    next_poll: float = 0.0
    ended: str | None = None  # the execution's final status, while its settlement is pending
    error_text: str | None = None


class _Stop(Exception):
    """Raised inside a job when the dispatcher stops while an AWS call is being retried."""


class Dispatcher:
    """Starts at most ``max_running`` Step Functions executions at a time from ``queue``.

    ``client_or_backend``: an :class:`turnstile.aio.AsyncClient` (or its backend).
    ``state_machine_arn``: a standard state machine. ``poll``: seconds between two
    ``DescribeExecution`` calls of one running execution. ``visibility_timeout``: how long a
    message stays in flight if this dispatcher dies (extended every third of it while its
    execution runs). ``max_attempts``, ``backoff``, ``max_backoff``: a failed execution's
    message is delivered again after ``backoff * 2 ** (attempt - 1)`` seconds (at most
    ``max_backoff``), and is a dead letter after ``max_attempts`` deliveries. ``sfn``: a boto3
    Step Functions client (default: one from the standard AWS settings).

    ``await dispatcher.run()`` runs until :meth:`stop` (or SIGTERM/SIGINT with
    ``handle_signals``): it then starts nothing more and returns, leaving the executions still
    running in flight for the next dispatcher to adopt."""

    def __init__(
        self,
        client_or_backend: AsyncClient | AsyncBackend,
        *,
        queue: str,
        state_machine_arn: str,
        max_running: int,
        poll: float = DEFAULT_POLL,
        visibility_timeout: float = DEFAULT_VISIBILITY,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: float = DEFAULT_BACKOFF,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
        sfn: Any = None,
    ) -> None:
        backend = (
            client_or_backend.backend
            if isinstance(client_or_backend, AsyncClient)
            else client_or_backend
        )
        if not backend.characteristics.queues:
            raise ConfigurationError(
                f"the {backend.characteristics.scheme}:// backend does not support queues"
            )
        self.max_running = validate.limit(max_running, "max_running")
        self.queue: AsyncQueue = AsyncQueue(
            backend.queues(),
            queue,
            visibility_timeout,
            max_attempts,
            self.max_running,
            long_poll_gets=backend.characteristics.long_poll_gets,
        )
        self.state_machine_arn = check_state_machine_arn(state_machine_arn)
        self.poll = validate.seconds(poll, "poll", low=0.01, high=3600.0)
        self.backoff = validate.seconds(backoff, "backoff", low=0.0, high=validate.MAX_DELAY)
        self.max_backoff = validate.seconds(
            max_backoff, "max_backoff", low=0.0, high=validate.MAX_DELAY
        )
        self._sfn = sfn
        self._stop = asyncio.Event()
        self._slot = asyncio.Event()
        self._jobs: dict[_Job, None] = {}  # claimed messages, in claim order
        self._fatal: DispatchError | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._describe_slots = asyncio.Semaphore(DESCRIBE_PARALLEL)
        self._checked = False
        self.result = DispatchResult()

    def __repr__(self) -> str:
        return (
            f"<Dispatcher queue={self.queue.name!r} max_running={self.max_running} "
            f"state_machine={self.state_machine_arn!r}>"
        )

    @property
    def running(self) -> int:
        """Messages held now (starting or with a running execution)."""
        return len(self._jobs)

    def stop(self, why: str = "stop()") -> None:
        """Start no new execution; :meth:`run` returns soon, leaving running ones in flight."""
        if self.result.stopped_by is None:
            self.result.stopped_by = why
        self._stop.set()
        self._slot.set()

    # -- AWS calls (boto3 is blocking: each runs in a thread) ----------------------------

    def _client(self) -> Any:
        if self._sfn is None:
            self._sfn = aws.client("stepfunctions")
        return self._sfn

    async def _call(self, method: str, **kwargs: Any) -> Any:
        client = self._client()
        return await threads.call(getattr(client, method), **kwargs)

    async def _retrying(self, what: str, method: str, **kwargs: Any) -> Any:
        """Call until it succeeds or fails with an AWS error code that is not transient (the
        caller handles those: ``aws.error_code`` of the raised error). Raises :class:`_Stop`
        if the dispatcher stops meanwhile."""
        delay = AWS_RETRY
        while True:
            try:
                return await self._call(method, **kwargs)
            except Exception as exc:
                code = aws.error_code(exc)
                if code is not None and not _transient(code):
                    raise
                log.warning("%s failed (%s), retrying in %.1fs", what, code or exc, delay)
            if await _wait(self._stop, delay):
                raise _Stop
            delay = min(delay * 2, AWS_RETRY_MAX)

    async def check(self) -> None:
        """``DescribeStateMachine``: raise :class:`DispatchError` if the state machine cannot be
        used (missing, not a standard one, no access), :class:`BackendUnavailable` if Step
        Functions cannot be reached."""
        try:
            found = await self._call(
                "describe_state_machine", stateMachineArn=self.state_machine_arn
            )
        except ConfigurationError:
            raise
        except Exception as exc:
            code = aws.error_code(exc)
            if code is None or _transient(code):
                raise BackendUnavailable(
                    f"Step Functions cannot be reached: {code or type(exc).__name__}: {exc}"
                ) from None
            raise DispatchError(
                f"state machine {self.state_machine_arn}: {code}: {_message(exc)}"
            ) from None
        kind = found.get("type", "STANDARD")
        if kind != "STANDARD":
            raise DispatchError(
                f"state machine {self.state_machine_arn} is {kind}: the dispatcher needs a "
                "STANDARD state machine (named executions it can describe)"
            )
        self._checked = True

    # -- the loop -------------------------------------------------------------------------

    async def run(self, *, handle_signals: bool = False) -> DispatchResult:
        """Check the state machine, then dispatch until stopped. Raises
        :class:`DispatchError` (before claiming anything, or when Step Functions refuses every
        start) and :class:`BackendUnavailable` (Step Functions unreachable at start)."""
        if not self._checked:
            await self.check()
        restore = self._install_signals() if handle_signals else None
        tracker = asyncio.create_task(self._track(), name="turnstile-dispatch-track")
        try:
            await self._claim_loop()
        finally:
            self._stop.set()
            for task in list(self._tasks):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            tracker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tracker
            if restore is not None:
                restore()
        if self._fatal is not None:
            raise self._fatal
        return self.result

    async def _claim_loop(self) -> None:
        delay = STORE_RETRY
        while not self._stop.is_set():
            if len(self._jobs) >= self.max_running:
                self._slot.clear()
                if len(self._jobs) >= self.max_running:
                    await self._slot.wait()
                continue
            try:
                message = await self.queue._get(None, self._stop)
            except BackendUnavailable as exc:
                log.warning("claiming from %r failed, retrying: %s", self.queue.name, exc)
                if await _wait(self._stop, delay):
                    return
                delay = min(delay * 2, STORE_RETRY_MAX)
                continue
            delay = STORE_RETRY
            if message is None:
                continue
            if self._stop.is_set():  # claimed as the stop came: hand it back at once
                await self._give_back(message, "dispatcher stopped before starting it")
                continue
            job = _Job(message, next_extend=self._extend_due())
            self._jobs[job] = None
            task = asyncio.create_task(self._begin(job), name=f"turnstile-dispatch:{message.id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _extend_due(self) -> float:
        return time.monotonic() + self.queue.visibility_timeout * timing.RENEW_FRACTION

    def _drop(self, job: _Job) -> None:
        self._jobs.pop(job, None)
        self._slot.set()

    async def _give_back(self, message: AsyncMessage, why: str) -> None:
        """A message this dispatcher will not start: delivered again at once."""
        with contextlib.suppress(TurnstileError):
            await message.nack(0.0, why)

    async def _begin(self, job: _Job) -> None:
        """Adopt, ack or start the execution of a freshly claimed message."""
        message = job.message
        try:
            if message.attempt > 1:
                log.info(
                    "message %s: attempt %d, looking for the executions of attempts 1 to %d",
                    message.id,
                    message.attempt,
                    message.attempt - 1,
                )
                earlier = await self._earlier_attempt(message)
                if earlier is not None:
                    status = earlier["status"]
                    if status == "RUNNING":
                        job.arn, job.name = earlier["executionArn"], earlier["name"]
                        job.started = time.monotonic()
                        job.next_poll = job.started + self.poll
                        self.result.adopted += 1
                        log.info("message %s: adopted running execution %s", message.id, job.name)
                        return
                    if status == "SUCCEEDED":
                        log.info(
                            "message %s: execution %s already SUCCEEDED; acking",
                            message.id,
                            earlier["name"],
                        )
                        await self._settle(job, "SUCCEEDED")
                        return
            await self._start(job)
        except _Stop:
            if job.arn is None:
                await self._give_back(message, "dispatcher stopped before starting it")
                self._drop(job)
        except DispatchError as exc:
            self._fatal = exc
            await self._give_back(message, str(exc))
            self._drop(job)
            self.stop("error")
        except Exception:
            log.exception("message %s: unexpected error; leaving it in flight", message.id)
            self._drop(job)  # it is delivered again after its visibility timeout

    async def _describe(self, arn: str) -> dict[str, Any] | None:
        """DescribeExecution (retried while transient); None if it does not exist."""
        try:
            found: dict[str, Any] = await self._retrying(
                "DescribeExecution", "describe_execution", executionArn=arn
            )
        except _Stop:
            raise
        except Exception as exc:
            if aws.error_code(exc) == "ExecutionDoesNotExist":
                return None
            raise
        return found

    async def _latest_generation(self, message_id: str, attempt: int) -> dict[str, Any] | None:
        """The execution of the latest generation of ``attempt`` (see :func:`execution_name`),
        None if there is none."""
        latest = None
        generation = 1
        while True:
            name = execution_name(message_id, attempt, generation)
            self.result.lookups += 1
            found = await self._describe(execution_arn(self.state_machine_arn, name))
            if found is None:
                return latest
            found.setdefault("name", name)
            latest = found
            generation += 1

    async def _earlier_attempt(self, message: AsyncMessage) -> dict[str, Any] | None:
        """The newest execution of an earlier attempt of ``message``, or None."""
        for attempt in range(message.attempt - 1, 0, -1):
            found = await self._latest_generation(message.id, attempt)
            if found is not None:
                return found
        return None

    async def _start(self, job: _Job) -> None:
        message = job.message
        body = execution_input(message, self.queue.name)
        generation = 1
        while True:
            if self._stop.is_set():  # stopped while looking: start nothing more
                raise _Stop
            name = execution_name(message.id, message.attempt, generation)
            try:
                answer = await self._retrying(
                    "StartExecution",
                    "start_execution",
                    stateMachineArn=self.state_machine_arn,
                    name=name,
                    input=body,
                )
            except _Stop:
                raise
            except Exception as exc:
                code = aws.error_code(exc)
                if code == "ExecutionAlreadyExists":
                    found = await self._describe(execution_arn(self.state_machine_arn, name))
                    if found is not None and _input_receipt(found) == message.receipt:
                        answer = found  # ours: a retried start whose first try went through
                    else:  # an earlier generation (the message came back from the dead)
                        generation += 1
                        continue
                elif code in MESSAGE_ERRORS:
                    text = f"StartExecution refused the message: {code}: {_message(exc)}"
                    log.warning("message %s: %s", message.id, text)
                    job.ended, job.error_text = code, text
                    await self._settle(job, code)
                    return
                else:
                    raise DispatchError(
                        f"StartExecution on {self.state_machine_arn}: {code}: {_message(exc)}"
                    ) from None
            job.arn, job.name = answer["executionArn"], name
            job.started = time.monotonic()
            job.next_poll = job.started + self.poll
            self.result.started += 1
            log.info("message %s (key %r): started %s", message.id, message.key, name)
            return

    # -- tracking -------------------------------------------------------------------------

    async def _track(self) -> None:
        vt = self.queue.visibility_timeout
        tick = max(0.01, min(self.poll / 4, vt * timing.RENEW_FRACTION / 2, 0.5))
        while True:
            await asyncio.sleep(tick)
            if self._stop.is_set():
                return  # running executions stay in flight for the next dispatcher
            now = time.monotonic()
            await asyncio.gather(
                *(self._track_one(job, now) for job in list(self._jobs)),
                return_exceptions=True,
            )

    async def _track_one(self, job: _Job, now: float) -> None:
        try:
            if now >= job.next_extend:
                extended = await job.message.extend(self.queue.visibility_timeout)
                if not extended:
                    self._elsewhere(job)
                    return
                job.next_extend = self._extend_due()
            if job.ended is not None:  # a settlement that failed: again
                await self._settle(job, job.ended)
                return
            if job.arn is None or now < job.next_poll:
                return
            job.next_poll = now + self.poll
            async with self._describe_slots:
                self.result.describes += 1
                try:
                    found = await self._call("describe_execution", executionArn=job.arn)
                except Exception as exc:
                    code = aws.error_code(exc)
                    if code == "ExecutionDoesNotExist":
                        job.error_text = f"execution {job.name} does not exist any more"
                        await self._settle(job, "MISSING")
                    else:
                        log.warning("DescribeExecution %s failed, will retry: %s", job.name, exc)
                    return
            status = found.get("status")
            if status == "RUNNING" or status not in aws.ENDED:
                return
            if status != "SUCCEEDED":
                details = ": ".join(str(x) for x in (found.get("error"), found.get("cause")) if x)
                job.error_text = f"execution {job.name} {status}" + (
                    f": {details}" if details else ""
                )
            await self._settle(job, status)
        except BackendUnavailable as exc:
            log.warning("message %s: store unavailable, will retry: %s", job.message.id, exc)
        except Exception:
            log.exception("message %s: unexpected error while tracking", job.message.id)

    async def _settle(self, job: _Job, status: str) -> None:
        """Ack (SUCCEEDED) or nack the message of a finished execution."""
        job.ended = status
        message = job.message
        try:
            if status == "SUCCEEDED":
                ok = await self.queue.ack(message.id, message.receipt)
            else:
                delay = min(self.max_backoff, self.backoff * 2 ** (message.attempt - 1))
                ok = await self.queue.nack(message.id, message.receipt, delay, job.error_text)
        except BackendUnavailable as exc:
            log.warning("message %s: settling failed, will retry: %s", message.id, exc)
            return
        if not ok:
            self._elsewhere(job)
            return
        if status == "SUCCEEDED":
            self.result.acked += 1
            log.info("message %s: %s SUCCEEDED; acked", message.id, job.name or "execution")
        else:
            self.result.nacked += 1
            log.info("message %s: %s", message.id, job.error_text or status)
        self._drop(job)

    def _elsewhere(self, job: _Job) -> None:
        log.info(
            "message %s: its receipt no longer works (settled by its execution, or its "
            "visibility timeout passed); no longer tracked",
            job.message.id,
        )
        self.result.settled_elsewhere += 1
        self._drop(job)

    # -- signals --------------------------------------------------------------------------

    def _install_signals(self) -> Callable[[], None]:
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []

        def on_signal(sig: signal.Signals) -> None:
            log.warning(
                "%s: starting no new execution; %d running stay in flight", sig.name, self.running
            )
            self.stop(sig.name)
            for each in installed:  # a second signal acts as usual
                loop.remove_signal_handler(each)
            installed.clear()

        for sig in (signal.SIGTERM, signal.SIGINT):
            if signal.getsignal(sig) == signal.SIG_IGN:
                continue
            try:
                loop.add_signal_handler(sig, on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):
                continue
            installed.append(sig)

        def restore() -> None:
            for each in installed:
                loop.remove_signal_handler(each)
            installed.clear()

        return restore


def _transient(code: str) -> bool:
    return code not in FATAL_ERRORS and code not in MESSAGE_ERRORS and code not in {
        "ExecutionAlreadyExists",
        "ExecutionDoesNotExist",
    }


def _message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Message") or exc)
    return str(exc)


def _input_receipt(described: dict[str, Any]) -> str | None:
    try:
        document = json.loads(described.get("input") or "{}")
        return str(document["turnstile"]["receipt"])
    except (ValueError, KeyError, TypeError):
        return None


async def _wait(event: asyncio.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``event``; True if it was set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()
