"""``turnstile queue list|put|get|ack|nack|stats|dead|requeue|purge``: the keyed FIFO queue from
the shell (see docs/queue.md)."""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any

from .._core import validate
from .._core.records import QueueStats
from ..errors import InvalidArgument
from . import _support, queue_work

EPILOG = """\
examples:
  turnstile queue list                                 # queues holding messages
  turnstile queue list webhooks- --stats               # names from a prefix, with counts
  turnstile queue put webhooks '{"order": 42, "event": "paid"}' --key order-42
  echo '{"n": 1}' | turnstile queue put jobs - --dedup-id evt-1
  turnstile queue get webhooks --timeout 30            # prints id, receipt, payload as JSON
  turnstile queue ack webhooks ID RECEIPT              # done (from any process)
  turnstile queue get webhooks --ack                    # take and settle at once
  turnstile queue stats webhooks [--json]
  turnstile queue dead webhooks [--json]
  turnstile queue requeue webhooks --all               # or: ... requeue webhooks ID ID
  turnstile queue purge webhooks --all                 # delete dead letters

PAYLOAD is JSON ('-' reads it from stdin); with --raw it is sent as bytes, unparsed.
get exits 75 when nothing came within --timeout; ack/nack exit 1 when the receipt is stale
(the visibility timeout passed: the message is or will be delivered again).
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _support.command_parser(
        subparsers,
        "queue",
        help="put, get and inspect keyed FIFO queues",
        description=(
            "A durable queue: messages of one key are delivered one at a time in put order,\n"
            "different keys in parallel, optionally at most --concurrency in flight in all."
        ),
        epilog=EPILOG,
    )
    sub = parser.add_subparsers(title="queue commands", metavar="ACTION")

    def action(name: str, help: str) -> argparse.ArgumentParser:
        p = _support.command_parser(sub, name, help=help, description=help)
        p.add_argument(
            "queue", metavar="QUEUE", type=_support.name_type("QUEUE"), help="queue name"
        )
        return p

    p = _support.command_parser(
        sub,
        "list",
        help="list queues that hold messages",
        description="List the queues that hold messages (ready, delayed, in flight or dead), "
        "in code-point order.",
    )
    p.add_argument(
        "prefix",
        metavar="PREFIX",
        nargs="?",
        default="",
        help="only queues whose names start with PREFIX (taken literally)",
    )
    p.add_argument(
        "--max",
        metavar="N",
        type=_support.int_type("--max", 1, validate.MAX_LIST),
        default=1000,
        help="at most N queues (default 1000)",
    )
    p.add_argument(
        "--stats",
        action="store_true",
        help="with each queue's ready, delayed, in flight and dead counts",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=list_command)

    p = action("put", "record a message; prints its id")
    p.add_argument("payload", metavar="PAYLOAD", help="JSON, or - to read it from stdin")
    p.add_argument("--raw", action="store_true", help="send PAYLOAD as bytes, not JSON")
    p.add_argument(
        "--key",
        metavar="KEY",
        type=_text("key", validate.key),
        help="one at a time per key, in put order",
    )
    p.add_argument(
        "--delay",
        metavar="S",
        type=_seconds("--delay", validate.delay),
        default=0.0,
        help="seconds before it can be delivered (default 0)",
    )
    p.add_argument(
        "--dedup-id",
        metavar="ID",
        type=_text("dedup_id", validate.dedup_id),
        help="store once per ID within --dedup-window",
    )
    p.add_argument(
        "--dedup-window",
        metavar="S",
        type=_seconds("--dedup-window", validate.dedup_window),
        default=validate.DEFAULT_DEDUP_WINDOW,
        help="seconds (default 300)",
    )
    p.add_argument(
        "--max-attempts",
        metavar="N",
        type=_support.int_type("--max-attempts", 1, validate.MAX_ATTEMPTS),
        default=5,
        help="deliveries before dead letter (default 5)",
    )
    p.set_defaults(handler=put_command)

    p = action("get", "take the next deliverable message; prints it as JSON")
    p.add_argument(
        "--timeout",
        metavar="S",
        type=_support.timeout_type("--timeout"),
        default=0.0,
        help="wait up to S seconds for one (default 0: do not wait)",
    )
    p.add_argument(
        "--visibility-timeout",
        metavar="S",
        type=_seconds("--visibility-timeout", validate.visibility_timeout),
        default=30.0,
        help="seconds it stays invisible unless acked (default 30)",
    )
    p.add_argument(
        "--concurrency",
        metavar="N",
        type=_support.limit_type("--concurrency"),
        help="take it only while fewer than N messages of the queue are in flight",
    )
    p.add_argument(
        "--max-attempts",
        metavar="N",
        type=_support.int_type("--max-attempts", 1, validate.MAX_ATTEMPTS),
        default=5,
        help="deliveries before dead letter (default 5)",
    )
    p.add_argument("--ack", action="store_true", help="ack it at once (consume it)")
    p.set_defaults(handler=get_command)

    for name, help in (
        ("ack", "settle a delivery as done"),
        ("nack", "settle a delivery as failed: deliver again (after --delay)"),
    ):
        p = action(name, help)
        p.add_argument("id", metavar="ID", type=_text("id", validate.message_id))
        p.add_argument("receipt", metavar="RECEIPT", type=_text("receipt", validate.receipt))
        if name == "nack":
            p.add_argument(
                "--delay",
                metavar="S",
                type=_seconds("--delay", validate.delay),
                default=0.0,
                help="seconds before it is delivered again",
            )
            p.add_argument("--error", metavar="TEXT", help="why (kept with a dead letter)")
        p.set_defaults(handler=settle_command, settle=name)

    p = action("stats", "ready, delayed, in flight, dead, oldest age, deepest keys")
    p.add_argument(
        "--top",
        metavar="N",
        type=_support.int_type("--top", 1, 1000),
        default=10,
        help="how many of the deepest keys (default 10)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=stats_command)

    p = action("dead", "list dead letters")
    p.add_argument(
        "--limit",
        metavar="N",
        type=_support.int_type("--limit", 1, validate.MAX_LIST),
        default=100,
        help="at most N (default 100)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=dead_command)

    for name, help in (
        ("requeue", "put dead letters back at the end of the queue"),
        ("purge", "delete dead letters"),
    ):
        p = action(name, help)
        p.add_argument(
            "ids",
            metavar="ID",
            nargs="*",
            type=_text("id", validate.message_id),
            help="dead letters by id",
        )
        p.add_argument("--all", action="store_true", help="every dead letter of QUEUE")
        p.set_defaults(handler=dead_edit_command, edit=name, edit_parser=p)
    queue_work.register(sub)  # `queue work`: cli/queue_work.py
    parser.set_defaults(handler=lambda args: _usage(sub))


def _usage(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> int:
    _support.error(f"choose an action: {', '.join(sub.choices)} (see: turnstile queue --help)")
    return _support.EXIT_USAGE


def _seconds(option: str, check: Any) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
        try:
            return float(check(value, option))
        except InvalidArgument as exc:
            raise _support.type_error(option, exc) from None

    return parse


def _text(python_name: str, check: Any) -> Any:
    """A text argument checked by the core's rule; its message names the CLI argument
    (argparse puts ``argument --key:`` in front), not the Python parameter."""

    def parse(text: str) -> str:
        try:
            return str(check(text))
        except InvalidArgument as exc:
            raise _support.type_error(python_name, exc) from None

    return parse


def _print_json(value: object) -> None:
    _support.print_json(value)


def _payload(args: argparse.Namespace) -> Any:
    if args.payload == "-":
        data = sys.stdin.buffer.read()
    else:
        data = args.payload.encode("utf-8", "surrogateescape")
    if args.raw:
        return data
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(
            f"PAYLOAD must be JSON ({exc}); quote strings ('\"text\"') or pass --raw for bytes"
        ) from None


def list_command(args: argparse.Namespace) -> int:
    with _support.connect(args) as client:
        names = client.queue_names(args.prefix, args.max)
        stats = [client.queue(n).stats(top_keys=1) for n in names] if args.stats else []
    if args.json:
        _print_json([s.to_dict() for s in stats] if args.stats else names)
        return _support.EXIT_OK
    if not names:
        where = f" starting with {args.prefix!r}" if args.prefix else ""
        print(f"no queue holds messages{where}")
        return _support.EXIT_OK
    if not args.stats:
        print("\n".join(_support.printable(n) for n in names))
        return _support.EXIT_OK
    width = max(5, *(len(_support.printable(s.name)) for s in stats))
    print(
        f"{'QUEUE':<{width}}  {'READY':>7}  {'DELAYED':>7}  {'IN FLIGHT':>9}  {'DEAD':>7}  OLDEST"
    )
    for s in stats:
        age = "-" if s.oldest_age is None else _support.duration(s.oldest_age)
        print(
            f"{_support.printable(s.name):<{width}}  {s.ready:>7}  {s.delayed:>7}  "
            f"{s.in_flight:>9}  {s.dead:>7}  {age}"
        )
    return _support.EXIT_OK


def put_command(args: argparse.Namespace) -> int:
    payload = _payload(args)
    with _support.connect(args) as client:
        q = client.queue(args.queue, max_attempts=args.max_attempts, dedup_window=args.dedup_window)
        print(q.put(payload, key=args.key, delay=args.delay, dedup_id=args.dedup_id))
    return _support.EXIT_OK


def _payload_fields(payload: Any) -> dict[str, Any]:
    """A payload as the HTTP API gives it: JSON in ``payload``, or bytes (put with --raw) in
    ``payload_base64``, the other one null; so no JSON payload can pass for bytes."""
    if isinstance(payload, bytes):
        return {"payload": None, "payload_base64": base64.b64encode(payload).decode("ascii")}
    return {"payload": payload, "payload_base64": None}


def _message_dict(m: Any) -> dict[str, object]:
    return {
        "id": m.id,
        "key": m.key,
        **_payload_fields(m.payload),
        "attempt": m.attempt,
        "enqueued_at": m.enqueued_at,
        "receipt": m.receipt,
        "deadline": m.deadline,
    }


def get_command(args: argparse.Namespace) -> int:
    with _support.connect(args) as client:
        q = client.queue(
            args.queue,
            visibility_timeout=args.visibility_timeout,
            max_attempts=args.max_attempts,
            concurrency=args.concurrency,
        )
        m = q.get(timeout=args.timeout)
        if m is None:
            _support.error(
                f"timed out: no message in {args.queue!r} within "
                f"{validate.seconds_text(args.timeout)}"
            )
            return _support.EXIT_TIMEOUT
        record = _message_dict(m)
        if args.ack:
            record["acked"] = m.ack()
        _print_json(record)
    return _support.EXIT_OK


def settle_command(args: argparse.Namespace) -> int:
    with _support.connect(args) as client:
        q = client.queue(args.queue)
        if args.settle == "ack":
            ok = q.ack(args.id, args.receipt)
        else:
            ok = q.nack(args.id, args.receipt, delay=args.delay, error=args.error)
    if not ok:
        _support.error(
            f"{args.settle} refused: receipt is stale (the visibility timeout passed, "
            "or it was already settled); the message is or will be delivered again"
        )
        return _support.EXIT_FAILURE
    return _support.EXIT_OK


def render_stats(s: QueueStats) -> list[str]:
    age = "-" if s.oldest_age is None else _support.duration(s.oldest_age)
    lines = [
        f"queue {_support.printable(s.name)}",
        f"  ready      {s.ready}",
        f"  delayed    {s.delayed}",
        f"  in flight  {s.in_flight}",
        f"  dead       {s.dead}",
        f"  oldest     {age}",
    ]
    if s.deepest_keys:
        lines.append("  deepest keys (pending messages)")
        width = max(len(_support.printable(k.key)) for k in s.deepest_keys)
        lines += [f"    {_support.printable(k.key):<{width}}  {k.pending}" for k in s.deepest_keys]
    return lines


def stats_command(args: argparse.Namespace) -> int:
    with _support.connect(args) as client:
        s = client.queue(args.queue).stats(top_keys=args.top)
    if args.json:
        _print_json(s.to_dict())
    else:
        print("\n".join(render_stats(s)))
    return _support.EXIT_OK


def dead_command(args: argparse.Namespace) -> int:
    with _support.connect(args) as client:
        dead = client.queue(args.queue).dead_letters(limit=args.limit)
    if args.json:
        _print_json([{**d.to_dict(), **_payload_fields(d.payload)} for d in dead])
        return _support.EXIT_OK
    if not dead:
        print(f"no dead letters in {args.queue!r}")
        return _support.EXIT_OK
    for d in dead:
        fields = _payload_fields(d.payload)
        if fields["payload_base64"] is not None:
            shown, payload = "payload_base64", fields["payload_base64"]
        else:
            shown, payload = "payload", json.dumps(fields["payload"], ensure_ascii=False)
        if len(payload) > 60:
            payload = payload[:57] + "..."
        key = "-" if d.key is None else _support.printable(d.key)
        print(
            f"{d.id}  key={key}  attempts={d.attempts}  error={_support.printable(d.error or '-')}"
            f"  {shown}={_support.printable(payload)}"
        )
    return _support.EXIT_OK


def dead_edit_command(args: argparse.Namespace) -> int:
    if bool(args.ids) == bool(args.all):
        args.edit_parser.error("give dead letter IDs or --all (not both)")
    with _support.connect(args) as client:
        q = client.queue(args.queue)
        ids = None if args.all else args.ids
        count = q.requeue(ids) if args.edit == "requeue" else q.purge_dead(ids)
    print(f"{'requeued' if args.edit == 'requeue' else 'purged'} {count} dead letter(s)")
    return _support.EXIT_OK
