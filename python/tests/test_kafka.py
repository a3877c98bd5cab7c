"""The Kafka loops against a broker (KAFKA_BROKERS, else the embedded one):
every record handled once in effect across duplicates and a restart of the
consumer mid-stream."""

from __future__ import annotations

import json
import secrets
import threading
import uuid

import pytest
from confluent_kafka import Producer

from conftest import database_url
from millrace import Event, Inbox, Participant, Record, Writer, consumer_config, protocol as p, run_consumer
from millrace.kafka import wait_for

import psycopg


def produce(brokers, topic, records):
    prod = Producer({"bootstrap.servers": brokers, "enable.idempotence": True, "acks": "all"})
    for key, value, headers in records:
        prod.produce(topic, key=key, value=value, headers=list(headers.items()))
    assert prod.flush(30) == 0


def command(saga_id, reply_topic, attempt=1):
    eid = str(uuid.uuid4())
    return (saga_id.encode(), json.dumps({"amount": 7}).encode(), {
        p.WATERMILL_UUID: eid, p.EVENT_ID: eid, p.SAGA_PROTOCOL: "1", p.SAGA_ID: saga_id, p.SAGA_TYPE: "t",
        p.SAGA_STEP: "credit", p.SAGA_ATTEMPT: str(attempt), p.SAGA_OPERATION: "action",
        p.SAGA_COMMAND: "reserve", p.SAGA_REPLY_TOPIC: reply_topic})


def run_for(target, until, timeout=60):
    """Runs target(stop) in a thread until until() holds; returns whether it did."""
    stop = threading.Event()
    t = threading.Thread(target=target, args=(stop,), daemon=True)
    t.start()
    ok = wait_for(until, timeout)
    stop.set()
    t.join(30)
    assert not t.is_alive()
    return ok


def count(conn, sql, *args):
    return conn.execute(sql, args).fetchone()[0]


def test_participant_over_kafka_across_a_restart(schema, conn, brokers):
    topic = "py-commands-" + secrets.token_hex(4)
    conn.execute(f"CREATE TABLE {p.table(schema, 'effect')} (saga_id text)")
    part = Participant("payments-" + topic, schema=schema)

    def reserve(c, call, cmd):
        c.execute(f"INSERT INTO {p.table(schema, 'effect')} VALUES (%s)", (call.saga_id,))
        return {"amount": cmd["amount"]}

    part.register("reserve", reserve)
    recs = [command(f"saga-{i}", "replies") for i in range(40)]
    # Every record twice (a redelivery), and a second attempt of some steps.
    produce(brokers, topic, recs + recs[:10] + [command(f"saga-{i}", "replies", 2) for i in range(5)])
    replies = f"SELECT count(*) FROM {p.table(schema, 'outbox_event')} WHERE event_type = 'saga.reply'"
    runner = lambda stop: part.run(conninfo=database_url(), brokers=brokers, topic=topic, stop=stop,  # noqa: E731
                                   instance_id=part.name + "-1")
    # Stopped once part of the way, then again to the end.
    assert run_for(runner, lambda: count(conn, replies) >= 10)
    assert run_for(runner, lambda: count(conn, replies) >= 45)
    assert count(conn, replies) == 45  # 40 first answers and 5 second attempts; no duplicate delivery answered
    assert count(conn, f"SELECT count(*) FROM {p.table(schema, 'effect')}") == 40
    assert count(conn, f"SELECT count(DISTINCT saga_id) FROM {p.table(schema, 'effect')}") == 40


def test_inbox_consumer_over_kafka_across_a_restart(schema, conn, brokers):
    topic = "py-events-" + secrets.token_hex(4)
    conn.execute(f"CREATE TABLE {p.table(schema, 'shipped')} (event_id uuid, n int)")
    inbox, writer = Inbox("shipping", schema), Writer(schema)
    events = []
    for n in range(60):
        eid = str(uuid.uuid4())
        events.append((f"order-{n % 7}".encode(), json.dumps({"n": n}).encode(), {p.EVENT_ID: eid, p.WATERMILL_UUID: eid}))
    produce(brokers, topic, events + events[::3])  # a third of them twice

    def apply(c, r: Record):
        n = json.loads(r.value)["n"]
        c.execute(f"INSERT INTO {p.table(schema, 'shipped')} VALUES (%s, %s)", (r.event_id, n))
        # An event of its own through the outbox, in the same transaction.
        writer.write(c, Event(topic="shipments", partition_key=r.key.decode(), payload={"n": n}))

    db = psycopg.connect(database_url(), autocommit=True)
    handled = lambda: count(conn, f"SELECT count(*) FROM {p.table(schema, 'shipped')}")  # noqa: E731
    runner = lambda stop: run_consumer(consumer_config(brokers, "shipping-" + topic, "shipping-1"), [topic],  # noqa: E731
                                       lambda r: inbox.handle(db, r, apply), stop)
    assert run_for(runner, lambda: handled() >= 20)
    assert run_for(runner, lambda: handled() >= 60)
    # Let the duplicates at the end through too.
    produce(brokers, topic, [(b"order-x", b'{"n": -1}', {p.EVENT_ID: str(uuid.uuid4())})])
    assert run_for(runner, lambda: handled() >= 61)
    db.close()
    assert handled() == 61
    assert count(conn, f"SELECT count(DISTINCT event_id) FROM {p.table(schema, 'shipped')}") == 61
    assert count(conn, f"SELECT count(*) FROM {p.table(schema, 'outbox_event')} WHERE topic = 'shipments'") == 61
