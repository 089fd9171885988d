"""``q.work(prefetch=n)`` in its own process, for the ``kill -9`` test: the handler logs each
message it starts, then blocks on the first one for good (the rest of its batch waits its
turn in the worker), so the test can kill the process while it holds a whole batch."""

from __future__ import annotations

import json
import sys
import threading

import turnstile


def main(opts: dict[str, object]) -> None:
    with turnstile.connect(str(opts["url"])) as client:
        q = client.queue(str(opts["name"]), visibility_timeout=float(opts["vt"]))  # type: ignore[arg-type]
        with open(str(opts["log"]), "a", buffering=1) as log:

            def handler(m: turnstile.Message) -> None:
                log.write(json.dumps([m.payload, m.attempt]) + "\n")
                threading.Event().wait()  # held until the process is killed

            q.work(handler, prefetch=int(opts["prefetch"]))  # type: ignore[call-overload]


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
