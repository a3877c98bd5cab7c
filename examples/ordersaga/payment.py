"""The order saga demo's payment service in Python (make demo-polyglot):
what startPayment in participants.go does in Go, with the millrace package
of python/. reserve_credit takes credit from the customer's account; its
compensation gives it back. The demo's Go side made the schemas, seeded
the accounts and runs the relay that ships this service's outbox.

Environment (set by the demo, python.go): DATABASE_URL, KAFKA_BROKERS,
PAYMENT_SCHEMA (the service's tables), MILLRACE_SCHEMA (millrace's),
PAYMENT_TOPIC, PAYMENT_GROUP, FLAKY_RELEASE (a saga whose credit release
fails twice before it succeeds; empty: none).
"""

import logging
import os
import signal
import sys
import threading

from psycopg.conninfo import make_conninfo

from millrace import Failure, Participant

env = os.environ
flaky, tries = env.get("FLAKY_RELEASE", ""), {}


def say(line):
    print(line, flush=True)


def reserve_credit(conn, call, cmd):
    cur = conn.execute("UPDATE account SET available = available - %s WHERE customer = %s AND available >= %s",
                       (cmd["amount"], cmd["customer"], cmd["amount"]))
    if cur.rowcount == 0:
        raise Failure("insufficient credit")
    (rid,) = conn.execute("INSERT INTO credit_ledger (saga_id, customer, kind, amount) VALUES (%s, %s, 'reserve', %s) RETURNING id",
                          (call.saga_id, cmd["customer"], cmd["amount"])).fetchone()
    return {"reservation": rid}


def release_credit(conn, call, cmd):
    row = conn.execute("SELECT reason FROM release_hold WHERE saga_id = %s", (call.saga_id,)).fetchone()
    if row:
        say(f"fault: payment: release of {call.saga_id}'s credit refused: {row[0]} (every retry fails: the saga will be stuck)")
        raise Failure(row[0])
    if call.saga_id == flaky:
        tries[flaky] = tries.get(flaky, 0) + 1
        if tries[flaky] <= 2:
            say(f"fault: payment: release of {flaky}'s credit fails ({tries[flaky]} of 2, injected); the orchestrator retries it with backoff")
            raise Failure("ledger busy")
        say(f"fault: payment: release of {flaky}'s credit succeeds on try {tries[flaky]}")
    conn.execute("UPDATE account SET available = available + %s WHERE customer = %s", (cmd["amount"], cmd["customer"]))
    conn.execute("INSERT INTO credit_ledger (saga_id, customer, kind, amount) VALUES (%s, %s, 'release', %s)",
                 (call.saga_id, cmd["customer"], cmd["amount"]))


class Counting(Participant):
    """A Participant that counts the commands it is handed (duplicates
    included): the demo compares its deliveries with its inbox marks."""

    deliveries = 0

    def handle(self, conn, record):
        Counting.deliveries += 1
        return super().handle(conn, record)


def report(stop):
    last = 0
    while not stop.wait(0.2):
        if Counting.deliveries != last:
            last = Counting.deliveries
            say(f"deliveries {last}")


def main():
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    p = Counting("payment", schema=env["MILLRACE_SCHEMA"])
    p.register("reserve_credit", reserve_credit, release_credit)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    conninfo = make_conninfo(env["DATABASE_URL"], options=f"-c search_path={env['PAYMENT_SCHEMA']}")
    say(f"payment (Python) consuming {env['PAYMENT_TOPIC']}")
    threading.Thread(target=report, args=(stop,), daemon=True).start()
    # The group is payment's, as in Go; static membership: a restarted
    # process takes its partitions back at once.
    p.run(conninfo=conninfo, brokers=env["KAFKA_BROKERS"], topic=env["PAYMENT_TOPIC"], stop=stop,
          group=env["PAYMENT_GROUP"], instance_id=env["PAYMENT_GROUP"] + "-py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
