"""Exactly-once consumption with millrace's inbox mark.

The mark is a row (consumer, event id) of processed_event, inserted in the
transaction of the handler's effects: it commits with them and never
before, and a redelivered event finds it and changes nothing. Go's
``inbox.Deduplicator`` uses the same table and rule.

    inbox = Inbox("billing", schema="billing")
    with conn.transaction():
        if inbox.mark(conn, record.event_id):
            apply(conn, record)          # runs once per event id
"""

from __future__ import annotations

import uuid

from . import protocol as p


class Inbox:
    """The inbox mark of one consumer name (each name dedups on its own)."""

    def __init__(self, consumer: str, schema: str = "millrace"):
        if not consumer or not p.valid_text(consumer) or "\\" in consumer or len(consumer.encode()) > p.MAX_IDENTIFIER:
            raise ValueError(f"millrace: invalid inbox consumer name {consumer!r}")
        self.consumer = consumer
        self.schema = p.check_schema(schema)
        self._mark = (
            f"INSERT INTO {p.table(schema, 'processed_event')} (consumer, event_id) VALUES (%s, %s) "
            "ON CONFLICT DO NOTHING"
        )

    def mark(self, conn, event_id: str) -> bool:
        """Records event_id in conn's current transaction and returns True for
        a new event, False for one recorded before (apply nothing). event_id
        must be a UUID (ValueError otherwise)."""
        cur = conn.execute(self._mark, (self.consumer, uuid.UUID(event_id)))
        return cur.rowcount == 1

    async def mark_async(self, aconn, event_id: str) -> bool:
        """mark, for a psycopg AsyncConnection."""
        cur = await aconn.execute(self._mark, (self.consumer, uuid.UUID(event_id)))
        return cur.rowcount == 1

    def handle(self, conn, record, apply) -> bool:
        """Runs apply(conn, record) in one transaction with record's mark;
        returns False, without running it, for a duplicate. An exception of
        apply rolls back the mark with the effects."""
        with conn.transaction():
            if not self.mark(conn, record.event_id):
                return False
            apply(conn, record)
            return True
