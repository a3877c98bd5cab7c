"""The Python participant of millrace's conformance kit.

    millrace conform participant --schema s --topic t --run "python -m millrace.conform"

It registers the conformance command, conform.reserve (docs/protocol.md,
"The conformance participant"), and runs until SIGTERM. The kit sets
DATABASE_URL, KAFKA_BROKERS, MILLRACE_SCHEMA, MILLRACE_TOPIC and
MILLRACE_CONFORM_CRASH_FILE.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading

from . import protocol as p
from .participant import Failure, Participant

CRASH_EXIT_STATUS = 3


def decode_reserve(payload: bytes) -> dict:
    """The payload as Go's encoding/json decodes it into the conformance
    command's struct: unknown fields ignored, null as absent, a field of
    another type refused."""
    v = json.loads(payload) if payload else None
    if v is None:
        v = {}
    if not isinstance(v, dict):
        raise ValueError(f"the payload is a JSON {type(v).__name__}, not an object")
    out = {"amount": 0, "fail": "", "fail_compensation": "", "crash": False}
    for name, typ in (("amount", int), ("fail", str), ("fail_compensation", str), ("crash", bool)):
        x = v.get(name)
        if x is None:
            continue
        if typ is int and (isinstance(x, bool) or not isinstance(x, int) or not -(2**63) <= x < 2**63):
            raise ValueError(f"{name} is {x!r}, not an integer")
        if typ is not int and not isinstance(x, typ):
            raise ValueError(f"{name} is {x!r}, not a {typ.__name__}")
        out[name] = x
    return out


def crash_point() -> None:
    """Ends the process at once, once: while the crash file exists."""
    f = os.environ.get("MILLRACE_CONFORM_CRASH_FILE", "")
    if not f:
        return
    try:
        os.remove(f)
    except FileNotFoundError:
        return
    os._exit(CRASH_EXIT_STATUS)


def conformance_participant(name: str, schema: str, crash=crash_point) -> Participant:
    """A Participant with the conformance command registered."""
    part = Participant(name, schema=schema)
    insert = f"INSERT INTO {p.table(schema, 'conform_effect')} (saga_id, step, operation, amount) VALUES (%s, %s, %s, %s)"

    def action(conn, call, cmd):
        conn.execute(insert, (call.saga_id, call.step, call.operation, cmd["amount"]))
        if cmd["crash"]:
            crash()
        if cmd["fail"]:
            raise Failure(cmd["fail"])
        return {"reserved": cmd["amount"], "key": call.idempotency_key}

    def compensate(conn, call, cmd):
        conn.execute(insert, (call.saga_id, call.step, call.operation, call.action_reply["reserved"]))
        if cmd["fail_compensation"]:
            raise Failure(cmd["fail_compensation"])

    part.register("conform.reserve", action, compensate, decode=decode_reserve)
    return part


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    env = os.environ
    topic, schema = env.get("MILLRACE_TOPIC", ""), env.get("MILLRACE_SCHEMA", "")
    if not topic or not schema or not env.get("DATABASE_URL") or not env.get("KAFKA_BROKERS"):
        print("millrace.conform: set DATABASE_URL, KAFKA_BROKERS, MILLRACE_SCHEMA and MILLRACE_TOPIC", file=sys.stderr)
        return 2
    name = "conform-py-" + topic
    part = conformance_participant(name, schema)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    logging.info("millrace.conform: participant %s on %s, schema %s", name, topic, schema)
    part.run(conninfo=env["DATABASE_URL"], brokers=env["KAFKA_BROKERS"], topic=topic, stop=stop,
             instance_id=name + "-1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
