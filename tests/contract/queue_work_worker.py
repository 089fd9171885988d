"""``q.work`` in its own process, for the graceful-stop test: each handler logs start/end
and takes ``work_s`` seconds once every worker has started one (so the first handler cannot
end, and take another message, while a slow second one is still starting). Prints the
WorkResult as JSON on exit."""

from __future__ import annotations

import json
import sys
import threading
import time

import turnstile


def main(opts: dict[str, object]) -> None:
    with turnstile.connect(str(opts["url"])) as client:
        q = client.queue(str(opts["name"]), visibility_timeout=float(opts["vt"]))  # type: ignore[arg-type]
        workers = int(opts["workers"])  # type: ignore[call-overload]
        started: list[object] = []
        all_started = threading.Event()
        with open(str(opts["log"]), "a", buffering=1) as log:

            def handler(m: turnstile.Message) -> None:
                log.write(json.dumps(["start", m.payload, time.time()]) + "\n")
                started.append(m.payload)
                if len(started) >= workers:
                    all_started.set()
                all_started.wait(60)
                time.sleep(float(opts["work_s"]))  # type: ignore[arg-type]
                log.write(json.dumps(["end", m.payload, time.time()]) + "\n")

            result = q.work(handler, workers=workers)
        print(json.dumps([result.acked, result.failed, result.lost, result.stopped_by]))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
