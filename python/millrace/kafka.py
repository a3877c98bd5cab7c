"""Kafka records as millrace reads them, and the consumer loop.

The loop hands each record, in order per partition, to a handler that does
its database work in a transaction of its own, and stores the record's
offset for commit only after the handler returned: a crash before the
commit brings the record again, never loses it. A handler that raises is
retried with backoff (the record is not skipped: order per key holds).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from . import protocol as p

log = logging.getLogger("millrace")


class InvalidEventID(ValueError):
    """A record whose event id is not a UUID."""


@dataclass
class Record:
    """One Kafka record. headers are decoded as UTF-8, invalid bytes kept
    as lone surrogates (so that protocol.valid_text refuses them)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def uuid(self) -> str:
        """The Watermill message UUID: its header, else derived from the
        record's position (the same on every delivery)."""
        return self.headers.get(p.WATERMILL_UUID) or p.record_event_id(self.topic, self.partition, self.offset)

    @property
    def event_id(self) -> str:
        """The dedup id: header event_id, else the message UUID. Raises
        InvalidEventID when it is not a UUID."""
        v = self.headers.get(p.EVENT_ID) or self.uuid
        try:
            return str(uuid.UUID(v))
        except ValueError:
            raise InvalidEventID(f"millrace: record {self.topic}/{self.partition}/{self.offset}: event id {v!r} is not a UUID")

    @classmethod
    def from_message(cls, msg) -> "Record":
        """The Record of a confluent_kafka Message."""
        headers = {}
        for k, v in msg.headers() or []:
            headers[k] = (v or b"").decode("utf-8", errors="surrogateescape")
        return cls(topic=msg.topic(), partition=msg.partition(), offset=msg.offset(), key=msg.key(),
                   value=msg.value() or b"", headers=headers)


def consumer_config(brokers: str, group: str, instance_id: str | None = None, **extra) -> dict:
    """The confluent_kafka Consumer configuration of the loop: offsets
    stored by hand after each record's transaction (and committed in the
    background), a new group from the oldest record, static membership
    when instance_id is given (a restarted process takes its partitions
    back at once)."""
    cfg = {
        "bootstrap.servers": brokers,
        "group.id": group,
        "enable.auto.commit": True,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 10000,
        "partition.assignment.strategy": "cooperative-sticky",
        "client.id": f"millrace-{group}-{socket.gethostname()}",
    }
    if instance_id:
        cfg["group.instance.id"] = instance_id
    cfg.update(extra)
    return cfg


def run_consumer(
    config: dict,
    topics: list[str],
    handle: Callable[[Record], None],
    stop: threading.Event,
    *,
    poll_timeout: float = 0.2,
    backoff: tuple[float, float] = (0.1, 5.0),
) -> None:
    """Consumes topics until stop is set: handle(record) for each record, in
    order per partition, retried with exponential backoff while it raises;
    then the record's offset is stored for commit."""
    from confluent_kafka import Consumer, KafkaError

    c = Consumer(config)
    try:
        c.subscribe(topics)
        while not stop.is_set():
            msg = c.poll(poll_timeout)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("millrace: consume: %s", msg.error())
                continue
            record = Record.from_message(msg)
            failures = 0
            while True:
                try:
                    handle(record)
                    break
                except Exception:
                    failures += 1
                    wait = min(backoff[1], backoff[0] * 2 ** (failures - 1))
                    log.exception("millrace: record %s/%d/%d failed (try %d); again in %.1fs",
                                  record.topic, record.partition, record.offset, failures, wait)
                    if stop.wait(wait):
                        return
            c.store_offsets(message=msg)
    finally:
        c.close()


def retry_connection(connect: Callable[[], object]):
    """A handler helper: returns get() giving a live psycopg connection,
    made again by connect() after it broke."""
    state = {"conn": None}

    def get():
        conn = state["conn"]
        if conn is None or conn.closed or conn.broken:
            state["conn"] = conn = connect()
        return conn

    return get


def wait_for(cond: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Polls cond until it holds or timeout seconds passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return cond()
