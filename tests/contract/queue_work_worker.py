"""``q.work`` in its own process, for the graceful-stop test: each handler logs start/end
and takes ``work_s`` seconds. Prints the WorkResult as JSON on exit."""

from __future__ import annotations

import json
import sys
import time

import turnstile


def main(opts: dict[str, object]) -> None:
    with turnstile.connect(str(opts["url"])) as client:
        q = client.queue(str(opts["name"]), visibility_timeout=float(opts["vt"]))  # type: ignore[arg-type]
        with open(str(opts["log"]), "a", buffering=1) as log:

            def handler(m: turnstile.Message) -> None:
                log.write(json.dumps(["start", m.payload, time.time()]) + "\n")
                time.sleep(float(opts["work_s"]))  # type: ignore[arg-type]
                log.write(json.dumps(["end", m.payload, time.time()]) + "\n")

            result = q.work(handler, workers=int(opts["workers"]))  # type: ignore[call-overload]
        print(json.dumps([result.acked, result.failed, result.lost, result.stopped_by]))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
