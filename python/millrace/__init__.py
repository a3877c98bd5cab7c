"""millrace for Python services: take part in millrace's sagas as a
participant, write events to millrace's outbox, and consume events exactly
once with millrace's inbox mark, speaking the wire protocol of
docs/protocol.md. millrace's relay and orchestrator, in Go, do the rest.
"""

from .inbox import Inbox
from .kafka import InvalidEventID, Record, consumer_config, run_consumer
from .outbox import Event, EventError, Writer, signal_event
from .participant import Call, Failure, Outcome, Participant, Poison
from .protocol import SAGA_PROTOCOL_VERSION, idempotency_key

__all__ = [
    "Call",
    "Event",
    "EventError",
    "Failure",
    "Inbox",
    "InvalidEventID",
    "Outcome",
    "Participant",
    "Poison",
    "Record",
    "SAGA_PROTOCOL_VERSION",
    "Writer",
    "consumer_config",
    "idempotency_key",
    "run_consumer",
    "signal_event",
]
