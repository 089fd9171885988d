"""``turnstile status``: who holds a name and who waits, in order, as a table or JSON; with
``--rate-limit NAME``, a rate limit's rate, recent admissions and line."""

from __future__ import annotations

import argparse
from typing import Any

from .. import Status
from .._core.records import RateStatus
from .._core.urls import redact
from . import _support
from .migrate import schema_version

EPILOG = """\
examples:
  turnstile status                     # every name with holders or waiters right now
  turnstile status deploy              # one name
  turnstile status --prefix order:     # names starting with order:
  turnstile status deploy --json | jq '.holders[0].token'
  turnstile status --rate-limit github-api   # a rate limit: its rate, admissions, line

Without --url or $TURNSTILE_URL the store is one SQLite file per user and host:
$XDG_STATE_HOME/turnstile/turnstile.db (default ~/.local/state/turnstile/turnstile.db);
the listing ends with the store it looked at.

Times come from the store's clock: age = since the grant, expires in = until the lease
lapses unless renewed, waiting = since the waiter first asked.
--json prints one object for NAME, else {"url": …, "names": [object, …], "truncated": bool,
"schema": {store, where, applied, latest, up_to_date} or null (stores without a schema)};
each object is {name, limit, now, holders: [{holder, token, acquired_at, expires_at, age,
expires_in}], waiters: [{holder, position, joined_at, expires_at, waiting}]}.
With --rate-limit NAME, --json prints {name, rate, per, burst, now, next_slot, admitted:
[times of the last `per` seconds], waiters: [{holder, position, joined_at, slot, due_in}]}
(rate, per and burst are null while the name is idle).
"""

MAX_NAMES = 1000


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _support.command_parser(
        subparsers,
        "status",
        help="show holders and waiters",
        description=(
            "Show the holders (holder, fencing token, age, expires in) and the waiters, in\n"
            "the order they will be served, of NAME, or of every name that has holders or\n"
            "waiters right now."
        ),
        epilog=EPILOG,
    )
    parser.add_argument(
        "name", metavar="NAME", nargs="?", type=_support.name_type("NAME"), help="lock or semaphore"
    )
    parser.add_argument(
        "--prefix", metavar="P", default="", help="without NAME: only names starting with P"
    )
    parser.add_argument(
        "--rate-limit",
        metavar="NAME",
        type=_support.name_type("--rate-limit"),
        help="show the rate limit NAME instead: its rate, recent admissions and its line",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=status_command, status_parser=parser)


def status_command(args: argparse.Namespace) -> int:
    if args.name is not None and args.prefix:
        args.status_parser.error("--prefix applies only without NAME")
    if args.rate_limit is not None:
        if args.name is not None or args.prefix:
            args.status_parser.error("--rate-limit takes no NAME or --prefix")
        with _support.connect(args) as client:
            rate = client.backend.rate_status(args.rate_limit)
        if args.json:
            _print_json(rate.to_dict())
        else:
            print("\n".join(render_rate(rate)))
        return _support.EXIT_OK
    with _support.connect(args) as client:
        if args.name is not None:
            status = client.status(args.name)
            if args.json:
                _print_json(status.to_dict())
            else:
                print("\n".join(render(status)))
            return _support.EXIT_OK
        names = client.names(args.prefix, MAX_NAMES + 1)
        truncated = len(names) > MAX_NAMES
        statuses = [client.status(name) for name in names[:MAX_NAMES]]
    schema = schema_version(_support.resolved_url(args))
    # A name can become free between names() and status(): show only live ones.
    statuses = [s for s in statuses if s.holders or s.waiters]
    if args.json:
        _print_json(
            {
                "url": redact(_support.resolved_url(args)),
                "names": [s.to_dict() for s in statuses],
                "truncated": truncated,
                "schema": None if schema is None else schema.to_dict(),
            }
        )
        return _support.EXIT_OK
    footer = "" if schema is None else f"\nstore: {schema.summary()}"
    store = f"(store: {_support.printable(redact(_support.resolved_url(args)))})"
    if not statuses:
        where = f" starting with {args.prefix!r}" if args.prefix else ""
        print(f"no names{where} have holders or waiters {store}{footer}")
        return _support.EXIT_OK
    blocks = ["\n".join(render(s)) for s in statuses]
    print("\n\n".join(blocks))
    if truncated:
        print(f"\n(only the first {MAX_NAMES} names are shown; narrow them with --prefix)")
    print(f"\n{store}{footer}")
    return _support.EXIT_OK


def _print_json(data: Any) -> None:
    _support.print_json(data)


def render(status: Status) -> list[str]:
    """The status of one name as lines of text."""
    name = _support.printable(status.name)
    if not status.holders and not status.waiters:
        return [f"{name}: free (no holders, no waiters)"]
    limit = "?" if status.limit is None else str(status.limit)
    waiting = f", {len(status.waiters)} waiting" if status.waiters else ""
    group = status.per_key is not None
    shape = f" (group: {status.per_key} per key)" if group else ""
    lines = [f"{name}: {len(status.holders)}/{limit} held{shape}{waiting}"]
    # Callback grants and waiters get one more column: the callback's kind and, for a
    # grant, its delivery (never the task token or URL); a group's, the key.
    shown = any(h.callback for h in status.holders) or any(w.callback for w in status.waiters)
    extra: tuple[str, ...] = ("CALLBACK",) if shown else ()
    keyed: tuple[str, ...] = ("KEY",) if group else ()
    rows: list[tuple[str, ...]] = [("HOLDER", *keyed, "TOKEN", "AGE", "EXPIRES IN", *extra)]
    for h in status.holders:
        callback = (f"{h.callback} ({h.delivery})" if h.callback else "-",) if shown else ()
        rows.append(
            (
                _support.printable(h.holder),
                *((_support.printable(h.key or "-"),) if group else ()),
                str(h.token),
                _support.duration(status.now - h.acquired_at),
                _support.duration(h.expires_at - status.now),
                *callback,
            )
        )
    shift = len(keyed)
    lines += _table(rows, right={1 + shift, 2 + shift, 3 + shift})
    if status.waiters:
        rows = [("POSITION", "WAITER", *keyed, "WAITING", *extra)]  # position 0: served next
        for w in status.waiters:
            rows.append(
                (
                    str(w.position),
                    _support.printable(w.holder),
                    *((_support.printable(w.key or "-"),) if group else ()),
                    _support.duration(status.now - w.joined_at),
                    *((w.callback or "-",) if shown else ()),
                )
            )
        lines += _table(rows, right={0, 2 + shift})
    return lines


def render_rate(status: RateStatus) -> list[str]:
    """The status of one rate limit as lines of text."""
    name = _support.printable(status.name)
    if status.rate is None or status.per is None:
        return [f"{name}: idle rate limit (nobody waits, no admission in its last period)"]
    per = f"{status.per:g} s"
    waiting = f", {len(status.waiters)} waiting" if status.waiters else ""
    lines = [
        f"{name}: rate limit {status.rate} per {per}, burst {status.burst}; "
        f"{len(status.admitted)} admitted in the last {per}{waiting}"
    ]
    if status.waiters:
        rows: list[tuple[str, ...]] = [("POSITION", "WAITER", "WAITING", "DUE IN")]
        for w in status.waiters:
            rows.append(
                (
                    str(w.position),
                    _support.printable(w.holder),
                    _support.duration(status.now - w.joined_at),
                    _support.duration(max(0.0, w.slot - status.now)),
                )
            )
        lines += _table(rows, right={0, 2, 3})
    else:
        due = _support.duration(max(0.0, status.next_slot - status.now))
        lines.append(f"  next admission: in {due}")
    return lines


def _table(rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        out.append(("  " + "  ".join(cells)).rstrip())
    return out
