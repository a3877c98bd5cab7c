"""The participant side of millrace's sagas, for Python services.

A participant registers an action and a compensation per command; each
command runs in one PostgreSQL transaction with its inbox mark, behind the
compensation barrier, and its reply goes through the outbox in the same
transaction (millrace's relay ships it). The rules are docs/protocol.md's;
the barrier's statements are those of millrace's Go participant.

    p = Participant("payments", schema="payments")

    def reserve(conn, call, cmd):
        if not debit(conn, cmd["account"], cmd["amount"]):
            raise Failure("insufficient credit")      # replied, no effect
        return {"amount": cmd["amount"]}               # the reply

    def release(conn, call, cmd):
        credit(conn, cmd["account"], call.action_reply["amount"])

    p.register("reserve_credit", reserve, release)
    p.run(conninfo=os.environ["DATABASE_URL"], brokers="localhost:9092",
          topic="payments.commands", instance_id="payments-1")
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

from . import protocol as p
from .inbox import Inbox
from .kafka import InvalidEventID, Record, consumer_config, retry_connection, run_consumer
from .outbox import Event, EventError, Writer

log = logging.getLogger("millrace")


class Failure(Exception):
    """A business failure ("insufficient credit"): raised by an action or a
    compensation, it rolls back what the function wrote and is replied as
    outcome failure with the reason. Any other exception is technical: the
    whole transaction rolls back and the command is tried again."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Poison(Exception):
    """A command that cannot be handled the same way on any try: it goes to
    the poison topic with the reason. One whose saga headers and reply topic
    are usable (call set: an unknown command, a payload that does not
    decode) is also answered with a failure whose reason begins
    POISONED_PREFIX; nothing else of it is written."""

    def __init__(self, reason: str, call: "Call | None" = None):
        super().__init__(reason)
        self.call = call


# The reason of the failure reply to an answered poisoned command begins so.
POISONED_PREFIX = "poisoned: "


@dataclass
class Call:
    """The command a function runs for."""

    saga_id: str
    saga_type: str
    step: str
    attempt: int
    operation: str
    command: str
    reply_topic: str
    idempotency_key: str
    # For a compensation: the action's reply, as JSON text and decoded.
    action_reply_raw: bytes | None
    action_reply: Any
    record: Record


# An action returns its reply (any JSON value; None replies {}).
Action = Callable[[Any, Call, Any], Any]
Compensate = Callable[[Any, Call, Any], None]


def decode_json(payload: bytes) -> Any:
    """The default command decoder: JSON (an empty payload is None)."""
    if not payload:
        return None
    return json.loads(payload)


@dataclass
class _Command:
    action: Action
    compensate: Compensate | None
    decode: Callable[[bytes], Any]


@dataclass
class Outcome:
    """What handle did with a record: "replied", "refused" (an unsupported
    protocol version, replied), "duplicate" (handled before) or "poisoned"."""

    kind: str
    reason: str = ""


class Participant:
    """A participant named name (its inbox consumer and consumer group)
    whose tables (barrier, outbox, inbox marks) live in schema. Register its
    commands, then run it (or call handle per record). Safe to use from
    several threads, each with its own connection."""

    def __init__(self, name: str, schema: str = "millrace", writer: Writer | None = None,
                 poison_topic: Callable[[str], str] | None = None):
        self.name = name
        self.schema = p.check_schema(schema)
        self.inbox = Inbox(name, schema)
        self.writer = writer or Writer(schema)
        self.poison_topic = poison_topic or (lambda topic: topic + ".poison")
        self._commands: dict[str, _Command] = {}
        t = p.table(schema, "compensation_barrier")
        returning = "RETURNING (b.xmax = 0 OR b.outcome = ''), b.outcome, b.reply, b.reason"
        # The statements of millrace's Go participant (compensation/barrier.go).
        self._claim_action = (
            f"INSERT INTO {t} AS b (saga_id, step, operation, saga_type, command, attempt)\n"
            f"VALUES (%s, %s, 'action', %s, %s, %s)\n"
            f"ON CONFLICT (saga_id, step, operation) DO UPDATE SET deliveries = b.deliveries + 1, updated_at = now(), {_RECLAIM_FAILURE}\n"
            f"{returning}"
        )
        self._claim_compensation = (
            f"INSERT INTO {t} AS b (saga_id, step, operation, saga_type, command)\n"
            f"VALUES (%s, %s, 'compensation', %s, %s)\n"
            f"ON CONFLICT (saga_id, step, operation) DO UPDATE SET deliveries = b.deliveries + 1, updated_at = now()\n"
            f"{returning}"
        )
        self._claim_for_compensation = (
            f"INSERT INTO {t} AS b (saga_id, step, operation, saga_type, command, outcome, reason)\n"
            f"VALUES (%s, %s, 'action', %s, %s, 'cancelled', %s)\n"
            f"ON CONFLICT (saga_id, step, operation) DO UPDATE SET updated_at = now(), {_RECLAIM_FAILURE}\n"
            f"RETURNING (b.xmax = 0 OR b.outcome = ''), b.outcome, b.reply"
        )
        self._finish = (
            f"UPDATE {t} SET outcome = %s, empty = %s, reply = %s, reason = %s\n"
            f"WHERE saga_id = %s AND step = %s AND operation = %s"
        )

    def register(self, name: str, action: Action, compensate: Compensate | None = None,
                 decode: Callable[[bytes], Any] = decode_json) -> None:
        """Declares command name: its action, its compensation (None: nothing
        to undo) and how its payload decodes (default JSON; an exception of
        decode poisons the command). The action gets (conn, call, cmd) and
        returns its reply; the compensation gets the same and returns None.
        Both run in the handling transaction: write with conn."""
        if not name or not p.valid_text(name) or len(name.encode()) > p.MAX_IDENTIFIER:
            raise ValueError(f"millrace: invalid command name {name!r}")
        if name in self._commands:
            raise ValueError(f"millrace: command {name!r} registered twice")
        self._commands[name] = _Command(action, compensate, decode)

    def command(self, name: str, compensate: Compensate | None = None, decode: Callable[[bytes], Any] = decode_json):
        """register as a decorator of the action."""
        def wrap(action: Action) -> Action:
            self.register(name, action, compensate, decode)
            return action
        return wrap

    # Handling one record.

    def handle(self, conn, record: Record) -> Outcome:
        """Handles one command record on conn (a psycopg 3 connection in
        autocommit mode, no transaction open): one transaction with its inbox
        mark, the barrier, the function and the reply; a poisoned record is
        written to the poison topic through the outbox instead. A technical
        error raises (nothing was written): try the record again."""
        try:
            event_id = record.event_id
            call, unsupported = _parse_call(record)
            cmd = None
            c = None
            if not unsupported:
                try:
                    self.writer.validate(Event(topic=call.reply_topic, partition_key=call.saga_id, payload=b"{}"))
                except EventError as err:
                    raise Poison(f"{p.SAGA_REPLY_TOPIC} {call.reply_topic!r}: the outbox refuses it as the reply's topic: {err.reason}")
                c = self._commands.get(call.command)
                if c is None:
                    raise Poison(f"unknown command {call.command!r} (participant {self.name})", call)
                try:
                    cmd = c.decode(record.value)
                except Exception as err:
                    raise Poison(f"payload of command {call.command!r}: {err}", call)
        except InvalidEventID as err:
            self._poison(conn, record, str(err))
            return Outcome("poisoned", str(err))
        except Poison as err:
            if err.call is None:
                self._poison(conn, record, str(err))
            else:
                self._answer_poisoned(conn, record, event_id, err.call, str(err))
            return Outcome("poisoned", str(err))

        with conn.transaction():
            if not self.inbox.mark(conn, event_id):
                return Outcome("duplicate")
            if unsupported:
                log.error("millrace: %s: command of an unsupported saga protocol version refused: saga %s step %s: %s",
                          self.name, call.saga_id, call.step, unsupported)
                self._reply(conn, call, p.FAILURE, unsupported, b"{}")
                return Outcome("refused", unsupported)
            outcome, reason, payload = self._run(conn, call, c, cmd)
            self._reply(conn, call, outcome, reason, payload)
            return Outcome("replied", outcome)

    def _run(self, conn, call: Call, c: _Command, cmd) -> tuple[str, str, bytes]:
        """The barrier's claim, the function when it may run, the answer."""
        if call.operation == p.ACTION:
            inserted, outcome, reply, reason = conn.execute(
                self._claim_action, (call.saga_id, call.step, call.saga_type, call.command, call.attempt)).fetchone()
            if inserted:
                return self._call(conn, call, lambda: c.action(conn, call, cmd), is_action=True)
            if outcome == p.CANCELLED:
                log.debug("millrace: %s: late action cancelled: saga %s step %s", self.name, call.saga_id, call.step)
                return outcome, reason, b"{}"
            if outcome in (p.SUCCESS, p.FAILURE):
                return outcome, reason, bytes(reply) or b"{}"
            raise RuntimeError(f"millrace: {self.name}: action {call.saga_id}/{call.step} has outcome {outcome!r} in the barrier")

        # A compensation: its own row first, then the action's (the lock order).
        inserted, outcome, reply, _ = conn.execute(
            self._claim_compensation, (call.saga_id, call.step, call.saga_type, call.command)).fetchone()
        act_inserted, act_outcome, act_reply = conn.execute(
            self._claim_for_compensation, (call.saga_id, call.step, call.saga_type, call.command, p.LATE_REASON)).fetchone()
        if not inserted and outcome == p.SUCCESS:
            return p.SUCCESS, "", bytes(reply) or b"{}"  # compensated before
        if act_outcome == p.SUCCESS and not act_inserted:
            if c.compensate is None:
                return self._finish_row(conn, call, p.SUCCESS, "", b"{}", empty=False)
            call.action_reply_raw = bytes(act_reply)
            call.action_reply = json.loads(call.action_reply_raw) if call.action_reply_raw else None
            return self._call(conn, call, lambda: c.compensate(conn, call, cmd), is_action=False)
        if act_outcome in (p.CANCELLED, p.FAILURE):
            # Empty: the action never ran (its row now blocks it), or it
            # failed and had no effect.
            log.debug("millrace: %s: empty compensation: saga %s step %s", self.name, call.saga_id, call.step)
            return self._finish_row(conn, call, p.SUCCESS, "", b"{}", empty=True)
        raise RuntimeError(f"millrace: {self.name}: action {call.saga_id}/{call.step} has outcome {act_outcome!r} in the barrier")

    def _answer_poisoned(self, conn, record: Record, event_id: str, call: Call, reason: str) -> None:
        """Poisons record and answers it, in one transaction with its inbox
        mark: a failure whose reason begins POISONED_PREFIX (nothing ran).
        An action's failure is stored in the barrier as its attempt's, so
        the same attempt delivered again (a requeue) never runs; the rows'
        other outcomes answer as always. A compensation writes no row."""
        why = _clean_reason(POISONED_PREFIX + reason)
        with conn.transaction():
            self._poison(conn, record, reason)
            if not self.inbox.mark(conn, event_id):
                return
            outcome, payload = p.FAILURE, b"{}"
            if call.operation == p.ACTION:
                inserted, stored, reply, stored_reason = conn.execute(
                    self._claim_action, (call.saga_id, call.step, call.saga_type, call.command, call.attempt)).fetchone()
                if inserted:
                    self._finish_row(conn, call, p.FAILURE, why, b"{}", empty=False)
                elif stored in (p.SUCCESS, p.FAILURE, p.CANCELLED):
                    outcome, why = stored, stored_reason or ""
                    payload = (bytes(reply) or b"{}") if stored != p.CANCELLED and reply is not None else b"{}"
                else:
                    raise RuntimeError(f"millrace: {self.name}: action {call.saga_id}/{call.step} has outcome {stored!r} in the barrier")
            self._reply(conn, call, outcome, why, payload)

    def _call(self, conn, call: Call, fn, is_action: bool) -> tuple[str, str, bytes]:
        try:
            with conn.transaction():  # a savepoint: a business failure rolls back to it
                result = fn()
        except Failure as f:
            reason = _clean_reason(f.reason)
            log.debug("millrace: %s: business failure: saga %s step %s %s: %s",
                      self.name, call.saga_id, call.step, call.operation, reason)
            return self._finish_row(conn, call, p.FAILURE, reason, b"{}", empty=False)
        payload = b"{}"
        if is_action and result is not None:
            payload = json.dumps(result, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return self._finish_row(conn, call, p.SUCCESS, "", payload, empty=False)

    def _finish_row(self, conn, call, outcome, reason, payload, empty):
        conn.execute(self._finish, (outcome, empty, payload, reason, call.saga_id, call.step, call.operation))
        return outcome, reason, payload

    def _reply(self, conn, call: Call, outcome: str, reason: str, payload: bytes) -> None:
        md = {
            p.SAGA_PROTOCOL: p.SAGA_PROTOCOL_VERSION,
            p.SAGA_ID: call.saga_id,
            p.SAGA_TYPE: call.saga_type,
            p.SAGA_STEP: call.step,
            p.SAGA_ATTEMPT: str(call.attempt),
            p.SAGA_OPERATION: call.operation,
            p.SAGA_COMMAND: call.command,
            p.SAGA_OUTCOME: outcome,
            p.CONTENT_TYPE: p.CONTENT_TYPE_JSON,
        }
        if reason:
            md[p.SAGA_REASON] = reason
        self.writer.write(conn, Event(topic=call.reply_topic, partition_key=call.saga_id, payload=payload,
                                      event_type=p.REPLY_EVENT_TYPE, aggregate_type=call.saga_type,
                                      aggregate_id=call.saga_id, metadata=md))

    def _poison(self, conn, record: Record, reason: str) -> None:
        """Writes record's poisoned copy to the poison topic through the
        outbox, in a transaction of its own (as millrace's Go
        PoisonPublisher does; a savepoint in the caller's), with the
        reason."""
        topic = self.poison_topic(record.topic)
        msg_uuid = p.clean_text(record.uuid)
        event_id = p.poison_event_id(topic, msg_uuid)
        md = {}
        for k, v in record.headers.items():
            k = p.clean_text(k)
            if k and k != p.WATERMILL_UUID:
                md[k] = p.clean_text(v)
        md[p.REASON_POISONED] = p.clean_text(reason)
        md[p.TOPIC_POISONED] = record.topic
        md[p.POISONED_ID] = msg_uuid
        key = next(k for k in (md.get(p.PARTITION_KEY, ""), md.get(p.AGGREGATE_ID, ""), msg_uuid, event_id)
                   if k and len(k.encode()) <= p.MAX_KEY_BYTES)
        ct = md.get(p.CONTENT_TYPE)
        binary = ct == p.CONTENT_TYPE_BINARY or not _is_json(record.value)
        md[p.EVENT_ID] = event_id
        md[p.PARTITION_KEY] = key
        if ct == p.CONTENT_TYPE_JSON and binary:
            md[p.CONTENT_TYPE] = p.CONTENT_TYPE_BINARY
        ev = Event(topic=topic, partition_key=key, payload=record.value, binary=binary, id=event_id,
                   event_type=md.get(p.EVENT_TYPE, ""), aggregate_type=md.get(p.AGGREGATE_TYPE, ""),
                   aggregate_id=md.get(p.AGGREGATE_ID, ""), metadata=md)
        log.error("millrace: %s: poisoned record %s/%d/%d to %s: %s", self.name, record.topic, record.partition,
                  record.offset, topic, reason)
        with conn.transaction():
            self.writer.write_if_new(conn, ev)

    # The Kafka loop.

    def run(self, *, conninfo: str, brokers: str, topic: str, stop: threading.Event | None = None,
            instance_id: str | None = None, group: str | None = None, consumer: dict | None = None) -> None:
        """Consumes topic in consumer group group (default: the participant's
        name) and handles each command until stop is set. instance_id turns
        on static group membership (one per process: a restarted process
        takes its partitions back at once). consumer adds confluent_kafka
        settings."""
        import psycopg

        stop = stop or threading.Event()
        conn = retry_connection(lambda: psycopg.connect(conninfo, autocommit=True))
        cfg = consumer_config(brokers, group or self.name, instance_id, **(consumer or {}))
        run_consumer(cfg, [topic], lambda r: self.handle(conn(), r), stop)


# The reclaim of a failed action row by a later attempt, or its cancelling
# by a compensation (compensation/barrier.go, reclaimFailure).
_RECLAIMABLE = "(b.outcome = 'failure' AND (excluded.outcome <> '' OR excluded.attempt > b.attempt))"
_RECLAIM_FAILURE = (
    f"outcome = CASE WHEN {_RECLAIMABLE} THEN excluded.outcome ELSE b.outcome END,\n"
    f"    reason = CASE WHEN {_RECLAIMABLE} THEN excluded.reason ELSE b.reason END,\n"
    f"    reply = CASE WHEN {_RECLAIMABLE} THEN '\\x'::bytea ELSE b.reply END,\n"
    f"    attempt = CASE WHEN {_RECLAIMABLE} THEN excluded.attempt ELSE b.attempt END"
)


def _parse_call(record: Record) -> tuple[Call, str]:
    """The command's saga headers; raises Poison when they cannot address a
    reply. The second value, when not empty, is why its protocol version is
    refused."""
    h = record.headers

    def ident(key: str, required: bool = True) -> str:
        v = h.get(key, "")
        if v == "" and required:
            raise Poison(f"metadata {key} is missing")
        if len(v.encode("utf-8", errors="surrogateescape")) > p.MAX_IDENTIFIER:
            raise Poison(f"metadata {key}: longer than {p.MAX_IDENTIFIER} bytes")
        if not p.valid_text(v):
            raise Poison(f"metadata {key} {v!r}: not valid UTF-8, or contains NUL")
        return v

    saga_id, saga_type, step = ident(p.SAGA_ID), ident(p.SAGA_TYPE, False), ident(p.SAGA_STEP)
    command, reply_topic = ident(p.SAGA_COMMAND), ident(p.SAGA_REPLY_TOPIC)
    op = h.get(p.SAGA_OPERATION, "")
    if op not in (p.ACTION, p.COMPENSATION):
        raise Poison(f"metadata {p.SAGA_OPERATION} is {op!r}, want {p.ACTION!r} or {p.COMPENSATION!r}")
    a = h.get(p.SAGA_ATTEMPT, "")
    digits = a[1:] if a.startswith("+") else a
    if not (digits.isascii() and digits.isdigit()) or not 1 <= int(digits) <= 2**31 - 1:
        raise Poison(f"metadata {p.SAGA_ATTEMPT} is {a!r}, want a positive decimal number")
    a = digits
    call = Call(saga_id=saga_id, saga_type=saga_type, step=step, attempt=int(a), operation=op, command=command,
                reply_topic=reply_topic, idempotency_key=p.idempotency_key(saga_id, step, op),
                action_reply_raw=None, action_reply=None, record=record)
    v = h.get(p.SAGA_PROTOCOL)
    if not p.supported_protocol(v):
        return call, f'{p.UNSUPPORTED_PROTOCOL} "{v}": this participant speaks version {p.SAGA_PROTOCOL_VERSION}'
    return call, ""


def _clean_reason(s: str) -> str:
    s = p.clean_text(str(s))
    b = s.encode("utf-8")
    if len(b) > p.MAX_REASON:
        s = b[: p.MAX_REASON].decode("utf-8", errors="ignore")
    return s


def _is_json(b: bytes) -> bool:
    try:
        json.loads(b.decode("utf-8"))
        return True
    except (UnicodeDecodeError, ValueError):
        return False
