"""The names and derived values of millrace's wire protocol (docs/protocol.md)."""

from __future__ import annotations

import os
import re
import time
import uuid

# The saga protocol version this package speaks.
SAGA_PROTOCOL_VERSION = "1"

# Headers (Watermill metadata) the outbox relay sets on every message.
EVENT_ID = "event_id"
EVENT_TYPE = "event_type"
AGGREGATE_TYPE = "aggregate_type"
AGGREGATE_ID = "aggregate_id"
PARTITION_KEY = "partition_key"
CONTENT_TYPE = "content_type"
WATERMILL_UUID = "_watermill_message_uuid"

CONTENT_TYPE_JSON = "application/json"
CONTENT_TYPE_BINARY = "application/octet-stream"

# The saga headers of commands and replies.
SAGA_PROTOCOL = "saga_protocol"
SAGA_ID = "saga_id"
SAGA_TYPE = "saga_type"
SAGA_STEP = "saga_step"
SAGA_ATTEMPT = "saga_attempt"
SAGA_OPERATION = "saga_operation"
SAGA_COMMAND = "saga_command"
SAGA_REPLY_TOPIC = "saga_reply_topic"
SAGA_OUTCOME = "saga_outcome"
SAGA_REASON = "saga_reason"

# The headers of an event for a saga's wait step (Signal).
SAGA_EVENT = "saga_event"
SAGA_EVENT_ID = "saga_event_id"

ACTION = "action"
COMPENSATION = "compensation"

SUCCESS = "success"
FAILURE = "failure"
CANCELLED = "cancelled"

# The headers of a poisoned copy.
REASON_POISONED = "reason_poisoned"
TOPIC_POISONED = "topic_poisoned"
POISONED_ID = "poisoned_message_id"

REPLY_EVENT_TYPE = "saga.reply"
LATE_REASON = "compensated before the action arrived"
UNSUPPORTED_PROTOCOL = "unsupported saga_protocol"

MAX_IDENTIFIER = 200
MAX_REASON = 1000
LANES = 128
MAX_KEY_BYTES = 1024

_IDEMPOTENCY_NAMESPACE = uuid.UUID("6d1b8f8e-5c3a-4a8e-9f0e-6a1f3b2c7d40")
_RECORD_NAMESPACE = uuid.UUID("5b1e0c1e-6f0a-4a8e-9a57-6d696c6c7261")
_POISON_NAMESPACE = uuid.UUID("2b9c3c8e-6f0e-4c1b-9a55-7d3f5e1a0c42")

_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def supported_protocol(version: str | None) -> bool:
    """Whether a command's or reply's saga_protocol is one this package speaks:
    "1", or absent (a message from before the header existed)."""
    return version is None or version == "" or version == SAGA_PROTOCOL_VERSION


def idempotency_key(saga_id: str, step: str, operation: str) -> str:
    """The stable key of a saga's step and operation, for external systems:
    the UUIDv5 of saga id, step and operation joined by NUL bytes."""
    return str(_uuid5(_IDEMPOTENCY_NAMESPACE, (saga_id + "\0" + step + "\0" + operation).encode("utf-8")))


def record_event_id(topic: str, partition: int, offset: int) -> str:
    """The event id of a record that carries none: the same on every delivery."""
    return str(_uuid5(_RECORD_NAMESPACE, f"{topic}/{partition}/{offset}".encode("utf-8")))


def poison_event_id(topic: str, message_uuid: str) -> str:
    """The outbox event id of a message poisoned to topic (as millrace's Go
    PoisonPublisher derives it): a message poisoned twice is written once."""
    return str(_uuid5(_POISON_NAMESPACE, (topic + "\0" + message_uuid).encode("utf-8")))


def _uuid5(namespace: uuid.UUID, name: bytes) -> uuid.UUID:
    # uuid.uuid5 takes a str and encodes it as UTF-8; names here may be
    # any bytes.
    import hashlib

    h = hashlib.sha1(namespace.bytes + name).digest()
    return uuid.UUID(bytes=h[:16], version=5)


def fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h ^= b
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def lane(partition_key: str) -> int:
    """The outbox lane of a partition key: FNV-1a of its UTF-8 bytes modulo 128."""
    return fnv1a32(partition_key.encode("utf-8")) % LANES


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of a schema's outbox relays."""
    return "millrace_outbox_%08x" % fnv1a32(schema.encode("utf-8"))


def check_schema(schema: str) -> str:
    """Returns schema if it is a plain lower-case identifier, as millrace's Go
    code requires; raises ValueError otherwise."""
    if not _SCHEMA.match(schema):
        raise ValueError(
            f"millrace: invalid schema name {schema!r}: use 1-63 lower-case letters, digits or underscores, not starting with a digit"
        )
    return schema


def table(schema: str, name: str) -> str:
    """schema.name, quoted (schema is validated)."""
    return f'"{check_schema(schema)}"."{name}"'


def valid_text(s: str) -> bool:
    """Whether s can be stored as PostgreSQL text and travel as a header:
    valid UTF-8 (no lone surrogates) without NUL."""
    if "\0" in s:
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def clean_text(s: str) -> str:
    """s with what PostgreSQL text cannot hold (NUL, invalid UTF-8) replaced by U+FFFD."""
    s = s.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")
    return s.replace("\0", "\ufffd")


def uuid7() -> uuid.UUID:
    """A new time-ordered UUID (version 7), as millrace's Go Writer makes."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)
