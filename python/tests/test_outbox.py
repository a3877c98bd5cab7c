"""The Python outbox writer writes the rows millrace's Go Writer writes
(docs/protocol.md, "The outbox table"); millrace's relay ships them
(internal/polyglot tests that end to end)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import psycopg
import pytest

from conftest import database_url
from millrace import Event, EventError, Writer, protocol as p, signal_event


def rows(conn, schema, *where):
    return conn.execute(
        f"SELECT e.event_id, e.topic, e.partition_key, e.lane, e.payload::text, e.payload_bytes, e.headers, "
        f"e.event_type, e.aggregate_type, e.aggregate_id, q.lane, q.partition_key "
        f"FROM {p.table(schema, 'outbox_event')} e JOIN {p.table(schema, 'outbox_pending')} q ON q.id = e.id "
        f"ORDER BY e.id").fetchall()


def test_rows_as_the_go_writer_writes_them(schema, conn):
    w = Writer(schema)
    with conn.transaction():
        ids = w.write(conn,
                      Event(topic="orders", partition_key="order-1", payload=b'{"b": 1,  "a":[2]}', event_type="OrderPaid",
                            aggregate_type="order", aggregate_id="order-1", metadata={"traceparent": "00-x"}),
                      Event(topic="blobs", partition_key="order-1", payload=b"\x00\xff", binary=True),
                      Event(topic="orders", partition_key="saga/ü", payload={"n": "ü"}))
    got = rows(conn, schema)
    assert [str(r[0]) for r in got] == ids
    assert all(uuid.UUID(i).version == 7 for i in ids)
    first, blob, third = got
    # JSON kept byte for byte (column json), binary as bytea, headers as a JSON object.
    assert first[4] == '{"b": 1,  "a":[2]}' and first[5] is None
    assert first[6] == {"traceparent": "00-x"}
    assert first[7:10] == ("OrderPaid", "order", "order-1")
    assert blob[4] is None and bytes(blob[5]) == b"\x00\xff" and blob[6] == {}
    assert json.loads(third[4]) == {"n": "ü"}
    for r in got:
        assert r[3] == p.lane(r[2]) == r[10] and r[11] == r[2]


def test_refused_events_write_nothing_and_leave_the_transaction_usable(schema, conn):
    w = Writer(schema)
    bad = [
        Event(topic="", partition_key="k"),
        Event(topic="t", partition_key=""),
        Event(topic="t", partition_key="k", payload=b"{not json"),
        Event(topic="t", partition_key="k", payload=b"\xff"),
        Event(topic="t\0", partition_key="k", payload={}),
        Event(topic="t", partition_key="k", payload={}, id="not-a-uuid"),
        Event(topic="t", partition_key="k", payload={}, metadata={"event_id": str(uuid.uuid4())}),
        Event(topic="t", partition_key="k", payload={}, metadata={"partition_key": "other"}),
        Event(topic="t", partition_key="k", payload={}, metadata={"x": "\0"}),
        Event(topic="t", partition_key="k", payload={}, metadata={"_watermill_message_uuid": "x"}),
        Event(topic="t", partition_key="k", payload={}, metadata={"content_type": p.CONTENT_TYPE_BINARY}),
        Event(topic="t", partition_key="k" * 1025, payload={}),
    ]
    with conn.transaction():
        for e in bad:
            with pytest.raises(EventError):
                w.write(conn, e)
        same = str(uuid.uuid4())
        with pytest.raises(EventError):
            w.write(conn, Event(topic="t", partition_key="k", payload={}, id=same),
                    Event(topic="t", partition_key="k", payload={}, id=same))
        w.write(conn, Event(topic="t", partition_key="k", payload={}))
    assert len(rows(conn, schema)) == 1


def test_same_id_twice_on_a_topic(schema, conn):
    w = Writer(schema)
    e = Event(topic="t", partition_key="k", payload={}, id=str(uuid.uuid4()))
    with conn.transaction():
        w.write(conn, e)
        w.write(conn, Event(topic="t2", partition_key="k", payload={}, id=e.id))  # a fan-out: another event
    with pytest.raises(psycopg.errors.UniqueViolation):
        with conn.transaction():
            w.write(conn, e)
    with conn.transaction():
        assert w.write_if_new(conn, e) == [e.id]  # skipped, not refused
    assert len(rows(conn, schema)) == 2


def test_rolled_back_events_vanish(schema, conn):
    w = Writer(schema)
    with pytest.raises(RuntimeError):
        with conn.transaction():
            w.write(conn, Event(topic="t", partition_key="k", payload={}))
            raise RuntimeError("the business change failed")
    assert rows(conn, schema) == []


def test_wake_up_hint_at_most_once_per_interval(schema, conn):
    listener = psycopg.connect(database_url(), autocommit=True)
    listener.execute(f"LISTEN {p.notify_channel(schema)}")
    w = Writer(schema, notify_interval=3600)  # one hint, then none for an hour
    for _ in range(5):
        with conn.transaction():
            w.write(conn, Event(topic="t", partition_key="k", payload={}))
    got = list(listener.notifies(timeout=1.0))
    assert len(got) == 1 and got[0].channel == p.notify_channel(schema)
    silent = Writer(schema, notify_interval=None)
    with conn.transaction():
        silent.write(conn, Event(topic="t", partition_key="k", payload={}))
    assert list(listener.notifies(timeout=0.5)) == []
    listener.close()


def test_async_write_and_signal_event(schema):
    async def go():
        aconn = await psycopg.AsyncConnection.connect(database_url(), autocommit=True)
        async with aconn:
            async with aconn.transaction():
                await Writer(schema).write_async(aconn, signal_event("order-7", "payment_confirmed", {"ok": True},
                                                                     topic="orders.events", event_id="pay-1"))
    asyncio.run(go())
    with psycopg.connect(database_url(), autocommit=True) as conn:
        (r,) = rows(conn, schema)
    assert r[1:3] == ("orders.events", "order-7")
    assert r[6] == {"saga_id": "order-7", "saga_event": "payment_confirmed", "saga_event_id": "pay-1"}
    assert json.loads(r[4]) == {"ok": True}


def test_cdc_writer_writes_the_log_row_only(schema, conn):
    with conn.transaction():
        Writer(schema, cdc=True).write(conn, Event(topic="t", partition_key="k", payload={}))
    assert conn.execute(f"SELECT count(*) FROM {p.table(schema, 'outbox_event')}").fetchone()[0] == 1
    assert conn.execute(f"SELECT count(*) FROM {p.table(schema, 'outbox_pending')}").fetchone()[0] == 0


def test_schema_names_are_checked():
    for bad in ("Millrace", "1x", "a-b", 'x"; DROP TABLE y; --', ""):
        with pytest.raises(ValueError):
            Writer(bad)
