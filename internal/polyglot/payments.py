"""The payments service of internal/polyglot's test, in Python: a saga
participant (charge, refunded as its compensation) and a consumer of the
orders service's events that answers each with an event of its own, all
through the millrace package (python/millrace), in one process.

Environment: DATABASE_URL, KAFKA_BROKERS, SCHEMA, COMMANDS_TOPIC,
ORDERS_EVENTS_TOPIC, PAYMENTS_EVENTS_TOPIC. SIGTERM stops it.
"""

import json
import logging
import os
import signal
import sys
import threading

import psycopg

from millrace import Event, Inbox, Participant, Writer, consumer_config, protocol as p, run_consumer

env = os.environ
schema = env["SCHEMA"]
ledger, seen = p.table(schema, "ledger"), p.table(schema, "order_seen")

part = Participant("payments", schema=schema)


def charge(conn, call, cmd):
    conn.execute(f"INSERT INTO {ledger} (saga_id, kind, amount) VALUES (%s, 'charge', %s)",
                 (call.saga_id, cmd["amount"]))
    return {"charged": cmd["amount"], "key": call.idempotency_key}


def refund(conn, call, cmd):
    conn.execute(f"INSERT INTO {ledger} (saga_id, kind, amount) VALUES (%s, 'refund', %s)",
                 (call.saga_id, call.action_reply["charged"]))


part.register("charge", charge, refund)

inbox, writer = Inbox("payments-orders", schema), Writer(schema)


def noted(conn, record):
    order = json.loads(record.value)["id"]
    conn.execute(f"INSERT INTO {seen} (event_id, order_id) VALUES (%s, %s)", (record.event_id, order))
    writer.write(conn, Event(topic=env["PAYMENTS_EVENTS_TOPIC"], partition_key=order, event_type="PaymentNoted",
                             payload={"order": order}))


def main():
    logging.basicConfig(level=logging.WARNING, format="payments.py %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    events_conn = psycopg.connect(env["DATABASE_URL"], autocommit=True)
    threads = [
        threading.Thread(target=part.run, kwargs=dict(conninfo=env["DATABASE_URL"], brokers=env["KAFKA_BROKERS"],
                                                      topic=env["COMMANDS_TOPIC"], stop=stop, instance_id="payments-1")),
        threading.Thread(target=run_consumer, args=(
            consumer_config(env["KAFKA_BROKERS"], "payments-orders", "payments-orders-1"), [env["ORDERS_EVENTS_TOPIC"]],
            lambda r: inbox.handle(events_conn, r, noted), stop)),
    ]
    for t in threads:
        t.start()
    print("payments.py: running", flush=True)
    for t in threads:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
