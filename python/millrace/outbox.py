"""Writing events to millrace's outbox in the caller's transaction.

The rows are those millrace's Go ``outbox.Writer`` writes (docs/protocol.md,
"The outbox table"), so millrace's relay, in Go, ships them to Kafka: the
events commit with the caller's own changes, or not at all.

    writer = Writer(schema="orders")
    with conn.transaction():
        conn.execute("UPDATE orders SET status = 'paid' WHERE id = %s", (order_id,))
        writer.write(conn, Event(topic="orders", partition_key=order_id,
                                 event_type="OrderPaid", payload={"order": order_id}))
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from . import protocol as p


class EventError(ValueError):
    """An event the outbox refuses (nothing of the call was written)."""

    def __init__(self, index: int, event_id: str, reason: str):
        super().__init__(f"millrace: outbox event {index} (id {event_id!r}): {reason}")
        self.index = index
        self.event_id = event_id
        self.reason = reason


@dataclass
class Event:
    """One event to write.

    payload is bytes or str of JSON text (kept byte for byte), or any other
    value, encoded with json.dumps; with binary=True it is opaque bytes.
    metadata travels as Kafka headers.
    """

    topic: str
    partition_key: str
    payload: Any = None
    event_type: str = ""
    aggregate_type: str = ""
    aggregate_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    binary: bool = False
    id: str = ""


# The millrace keys the relay sets: an event's metadata must agree.
_RESERVED = (p.EVENT_ID, p.PARTITION_KEY, p.EVENT_TYPE, p.AGGREGATE_TYPE, p.AGGREGATE_ID)


class Writer:
    """Writes events to a schema's outbox in the caller's transaction.

    notify_interval is the least time, in seconds, between two wake-up
    hints (a pg_notify in the writing transaction) this Writer sends to the
    relays: one per transaction would halve the write rate. None turns the
    hints off (relays then poll). validate_topic, if set, checks each topic
    (raise ValueError to refuse one). cdc=True writes only the log row, for
    millrace's CDC relay. A Writer is safe to share between threads.
    """

    def __init__(
        self,
        schema: str = "millrace",
        notify_interval: float | None = 0.001,
        validate_topic: Callable[[str], None] | None = None,
        cdc: bool = False,
    ):
        p.check_schema(schema)
        self.schema = schema
        self.channel = p.notify_channel(schema)
        self.notify_interval = None if cdc else notify_interval
        self.validate_topic = validate_topic
        self._lock = threading.Lock()
        self._last_notify: float | None = None
        events, pending = p.table(schema, "outbox_event"), p.table(schema, "outbox_pending")
        cols = "event_id, aggregate_type, aggregate_id, event_type, topic, partition_key, lane, payload, payload_bytes, headers"
        select = (
            "SELECT * FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], "
            "%s::int2[], %s::text[]::json[], %s::bytea[], %s::text[]::jsonb[])"
        )
        if cdc:
            self._insert = f"INSERT INTO {events} ({cols}) {select}"
            self._insert_new = f"INSERT INTO {events} ({cols}) {select} ON CONFLICT (event_id, topic) DO NOTHING"
            self._insert_notify = self._insert
            return
        def many(on_conflict: str) -> str:
            return (
                f"WITH ev AS (INSERT INTO {events} ({cols}) {select}{on_conflict} RETURNING id, lane, partition_key), "
                f"pe AS (INSERT INTO {pending} (id, lane, partition_key) SELECT id, lane, partition_key FROM ev) "
            )
        self._insert = many("") + "SELECT 1"
        self._insert_notify = many("") + "SELECT pg_notify(%s, '')"
        self._insert_new = many(" ON CONFLICT (event_id, topic) DO NOTHING") + "SELECT 1"

    def write(self, conn, *events: Event) -> list[str]:
        """Writes events in conn's current transaction (psycopg 3 connection,
        inside ``with conn.transaction():``) in one statement, and returns
        their ids. An invalid event raises EventError before anything is sent.
        An id written before on the same topic raises psycopg's
        UniqueViolation (the transaction is then aborted)."""
        return self._write(conn, events, self._insert, notify=True)

    def write_if_new(self, conn, *events: Event) -> list[str]:
        """write, except that an event whose id was written before on its
        topic is skipped, not refused (for events with derived ids, such as
        a poisoned copy written again after a redelivery)."""
        return self._write(conn, events, self._insert_new, notify=False)

    async def write_async(self, aconn, *events: Event) -> list[str]:
        """write, for a psycopg AsyncConnection."""
        sql, args, ids = self._statement(events, self._insert, notify=True)
        await aconn.execute(sql, args)
        return ids

    def validate(self, *events: Event) -> None:
        """Raises EventError for the first event write would refuse."""
        self._rows(events)

    def _write(self, conn, events, insert, notify) -> list[str]:
        sql, args, ids = self._statement(events, insert, notify)
        conn.execute(sql, args)
        return ids

    def _statement(self, events, insert, notify):
        rows = self._rows(events)
        cols = [list(c) for c in zip(*rows)]
        ids = [str(u) for u in cols[0]]
        sql = insert
        if notify and self._notify_due():
            sql = self._insert_notify
            cols.append(self.channel)
        return sql, cols, ids

    def _notify_due(self) -> bool:
        if self.notify_interval is None:
            return False
        now = time.monotonic()
        with self._lock:
            if self._last_notify is None or now - self._last_notify >= self.notify_interval:
                self._last_notify = now
                return True
        return False

    def _rows(self, events: Iterable[Event]) -> list[tuple]:
        rows = []
        seen: dict[tuple, int] = {}
        events = list(events)
        if not events:
            raise ValueError("millrace: no events to write")
        for i, e in enumerate(events):
            row = self._row(i, e)
            k = (row[0], e.topic)
            if k in seen:
                raise EventError(i, e.id, f"event id already used on this topic: also event {seen[k]} of the call")
            seen[k] = i
            rows.append(row)
        return rows

    def _row(self, i: int, e: Event) -> tuple:
        def fail(reason: str):
            raise EventError(i, e.id, reason)

        if not e.topic:
            fail("event has no topic")
        if not e.partition_key:
            fail("event has an empty partition key")
        for name in ("topic", "partition_key", "aggregate_type", "aggregate_id", "event_type"):
            v = getattr(e, name)
            if not isinstance(v, str) or not p.valid_text(v):
                fail(f"{name} {v!r} is not text without NUL")
        if len(e.topic.encode()) > p.MAX_KEY_BYTES or len(e.partition_key.encode()) > p.MAX_KEY_BYTES:
            fail(f"topic or partition key over {p.MAX_KEY_BYTES} bytes")
        if self.validate_topic is not None:
            try:
                self.validate_topic(e.topic)
            except ValueError as err:
                fail(f"invalid topic {e.topic!r}: {err}")
        if e.id:
            try:
                event_id = uuid.UUID(e.id)
            except ValueError:
                fail(f"event id {e.id!r} is not a UUID")
        else:
            event_id = p.uuid7()
        payload, payload_bytes = None, None
        if e.binary:
            payload_bytes = bytes(e.payload or b"")
        else:
            if isinstance(e.payload, (bytes, bytearray, memoryview)):
                text = bytes(e.payload)
                try:
                    payload = text.decode("utf-8")
                except UnicodeDecodeError:
                    fail("payload is not valid JSON in UTF-8 (set binary for opaque payloads)")
            elif isinstance(e.payload, str):
                payload = e.payload
            else:
                payload = json.dumps(e.payload, ensure_ascii=False, separators=(",", ":"))
            try:
                json.loads(payload)
                payload.encode("utf-8")
            except (ValueError, UnicodeEncodeError):
                fail("payload is not valid JSON in UTF-8 (set binary for opaque payloads)")
        md = dict(e.metadata or {})
        for k, v in md.items():
            if not isinstance(k, str) or not k or not p.valid_text(k) or not isinstance(v, str) or not p.valid_text(v):
                fail(f"metadata {k!r} cannot travel unchanged (NUL, invalid UTF-8, or not text)")
        if md:
            own = {p.EVENT_ID: str(event_id), p.PARTITION_KEY: e.partition_key, p.EVENT_TYPE: e.event_type,
                   p.AGGREGATE_TYPE: e.aggregate_type, p.AGGREGATE_ID: e.aggregate_id}
            for k in _RESERVED:
                if k in md and md[k] != own[k] and (k in (p.EVENT_ID, p.PARTITION_KEY) or own[k] != ""):
                    fail(f"metadata {k} is {md[k]!r}, the event's is {own[k]!r}")
            if p.WATERMILL_UUID in md:
                fail(f"metadata {p.WATERMILL_UUID} is reserved")
            ct = md.get(p.CONTENT_TYPE)
            want = p.CONTENT_TYPE_BINARY if e.binary else p.CONTENT_TYPE_JSON
            if ct in (p.CONTENT_TYPE_JSON, p.CONTENT_TYPE_BINARY) and ct != want:
                fail(f"metadata {p.CONTENT_TYPE} is {ct!r}, but the payload is stored as {want}")
        headers = json.dumps(md, ensure_ascii=False, separators=(",", ":"))
        return (event_id, e.aggregate_type, e.aggregate_id, e.event_type, e.topic, e.partition_key,
                p.lane(e.partition_key), payload, payload_bytes, headers)


def signal_event(saga_id: str, event: str, payload: Any = None, *, topic: str, event_id: str = "") -> Event:
    """The outbox event that delivers event (a name a saga's wait step waits
    for) to saga saga_id through topic, which the orchestrator's service
    consumes with saga.Orchestrator.EventHandler (docs/protocol.md, "Events
    of wait steps"). event_id, if given, dedups the delivery."""
    md = {p.SAGA_ID: saga_id, p.SAGA_EVENT: event}
    if event_id:
        md[p.SAGA_EVENT_ID] = event_id
    return Event(topic=topic, partition_key=saga_id, payload=payload if payload is not None else {},
                 event_type=event, aggregate_type="saga-event", aggregate_id=saga_id, metadata=md)
