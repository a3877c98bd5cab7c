"""The inbox mark: one row of processed_event per (consumer, event id),
committed with the effects and never before them."""

from __future__ import annotations

import uuid

import pytest

from millrace import Inbox, Record, protocol as p


def test_mark_new_then_duplicate(schema, conn):
    inbox, other = Inbox("billing", schema), Inbox("shipping", schema)
    eid = str(uuid.uuid4())
    with conn.transaction():
        assert inbox.mark(conn, eid)
    with conn.transaction():
        assert not inbox.mark(conn, eid)
        assert other.mark(conn, eid)  # each consumer name dedups on its own


def test_a_failed_handler_rolls_back_its_mark(schema, conn):
    inbox = Inbox("billing", schema)
    conn.execute(f"CREATE TABLE {p.table(schema, 'effect')} (event_id uuid)")
    rec = Record(topic="t", partition=0, offset=0, key=b"k", value=b"{}", headers={p.EVENT_ID: str(uuid.uuid4())})
    calls = []

    def apply(c, r):
        calls.append(r.event_id)
        c.execute(f"INSERT INTO {p.table(schema, 'effect')} VALUES (%s)", (r.event_id,))
        if len(calls) == 1:
            raise RuntimeError("technical")

    with pytest.raises(RuntimeError):
        inbox.handle(conn, rec, apply)
    assert inbox.handle(conn, rec, apply)       # the redelivery runs it
    assert not inbox.handle(conn, rec, apply)   # then it is a duplicate
    assert conn.execute(f"SELECT count(*) FROM {p.table(schema, 'effect')}").fetchone()[0] == 1
    assert len(calls) == 2


def test_event_id_of_a_record():
    eid, wid = str(uuid.uuid4()), str(uuid.uuid4())
    assert Record("t", 0, 0, None, b"", {p.EVENT_ID: eid, p.WATERMILL_UUID: wid}).event_id == eid
    assert Record("t", 0, 0, None, b"", {p.WATERMILL_UUID: wid}).event_id == wid
    assert Record("t", 3, 9, None, b"", {}).event_id == p.record_event_id("t", 3, 9)
    with pytest.raises(ValueError):
        Record("t", 0, 0, None, b"", {p.EVENT_ID: "nope"}).event_id


def test_consumer_names_are_checked():
    for bad in ("", "a\\b", "x" * 201, "a\0b"):
        with pytest.raises(ValueError):
            Inbox(bad)
