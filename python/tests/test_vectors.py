"""The protocol's test vectors (testdata/protocol) through the Python
participant in process: each case's records handled one per transaction,
the replies read from the outbox, the effects from the conformance table. A
crash is an exception at the action's crash point, which rolls the
transaction back; the record is then handled again. The conformance kit runs
the same cases over Kafka against `python -m millrace.conform`."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest

from conftest import cases, vectors
from millrace import Record, protocol as p
from millrace.conform import conformance_participant

REPLY_TOPIC = "conform.replies"


class Crashed(Exception):
    pass


def records(case: dict, saga_id: str) -> list[Record]:
    """The case's records, as the kit builds them (internal/conform)."""
    labels: dict[str, str] = {}
    out = []
    for i, s in enumerate(case["sends"]):
        eid = str(uuid.uuid4())
        if s.get("event"):
            eid = labels.setdefault(s["event"], eid)
        h = {
            p.WATERMILL_UUID: eid, p.EVENT_ID: eid, p.PARTITION_KEY: saga_id, p.CONTENT_TYPE: p.CONTENT_TYPE_JSON,
            p.SAGA_PROTOCOL: "1", p.SAGA_ID: saga_id, p.SAGA_TYPE: "conform", p.SAGA_STEP: s.get("step", "credit"),
            p.SAGA_ATTEMPT: str(s["attempt"]), p.SAGA_OPERATION: s["operation"],
            p.SAGA_COMMAND: s.get("command", "conform.reserve"), p.SAGA_REPLY_TOPIC: REPLY_TOPIC,
            "conform_send": f"{saga_id}#{i}",
        }
        if "protocol" in s:
            if s["protocol"] is None:
                del h[p.SAGA_PROTOCOL]
            else:
                h[p.SAGA_PROTOCOL] = s["protocol"]
        if "event_id" in s:
            h[p.EVENT_ID] = s["event_id"]
        for k, v in (s.get("headers") or {}).items():
            if v is None:
                h.pop(k, None)
            else:
                h[k] = v
        value = s["raw_payload"].encode() if "raw_payload" in s else json.dumps(s.get("payload")).encode()
        out.append(Record(topic="conform.commands", partition=0, offset=i, key=saga_id.encode(), value=value, headers=h))
    return out


def check(case: dict, saga_id: str, replies: list[dict], effects: list[tuple], poisoned: set[int]) -> list[str]:
    """What internal/conform's Check says, in Python."""
    problems = []
    sends = case["sends"]
    step_of = lambda i: sends[i].get("step", "credit")  # noqa: E731
    steps = list(dict.fromkeys(step_of(i) for i in range(len(sends))))
    for step in steps:
        want = [r for r in case["replies"] if step_of(r["send"]) == step]
        got = [r for r in replies if r["headers"][p.SAGA_STEP] == step]
        if len(want) != len(got):
            problems.append(f"step {step}: {len(got)} replies, want {len(want)}: {got}")
            continue
        for w, g in zip(want, got):
            s, h = sends[w["send"]], g["headers"]
            expect = {p.SAGA_PROTOCOL: "1", p.SAGA_ID: saga_id, p.SAGA_TYPE: "conform", p.SAGA_STEP: step,
                      p.SAGA_ATTEMPT: str(s["attempt"]), p.SAGA_OPERATION: s["operation"],
                      p.SAGA_COMMAND: s.get("command", "conform.reserve"), p.SAGA_OUTCOME: w["outcome"],
                      p.CONTENT_TYPE: p.CONTENT_TYPE_JSON}
            for k, v in expect.items():
                if h.get(k) != v:
                    problems.append(f"send {w['send']}: header {k} is {h.get(k)!r}, want {v!r}")
            reason = h.get(p.SAGA_REASON, "")
            if "reason_prefix" in w:
                if not reason.startswith(w["reason_prefix"]):
                    problems.append(f"send {w['send']}: reason {reason!r}, want a prefix {w['reason_prefix']!r}")
            elif reason != w.get("reason", ""):
                problems.append(f"send {w['send']}: reason {reason!r}, want {w.get('reason', '')!r}")
            payload = json.dumps(w.get("payload", {})).replace(
                "{{key}}", p.idempotency_key(saga_id, step, s["operation"]))
            if json.loads(payload) != json.loads(g["payload"]):
                problems.append(f"send {w['send']}: payload {g['payload']}, want {payload}")
            if g["key"] != saga_id or g["event_type"] != p.REPLY_EVENT_TYPE:
                problems.append(f"send {w['send']}: key {g['key']!r}, event type {g['event_type']!r}")
    want_effects = Counter((e.get("step", "credit"), e["operation"], e["amount"]) for e in case["effects"])
    if Counter(effects) != want_effects:
        problems.append(f"effects {sorted(effects)}, want {sorted(want_effects.elements())}")
    if poisoned != set(case.get("poisoned", [])):
        problems.append(f"poisoned {sorted(poisoned)}, want {sorted(case.get('poisoned', []))}")
    return problems


@pytest.fixture
def participant(schema, conn):
    conn.execute(f"""CREATE TABLE {p.table(schema, 'conform_effect')} (saga_id text NOT NULL, step text NOT NULL,
        operation text NOT NULL, amount bigint NOT NULL, at timestamptz NOT NULL DEFAULT now())""")
    armed = set()

    def crash():
        if armed:
            armed.clear()
            raise Crashed()

    part = conformance_participant("conform", schema, crash=crash)
    return part, armed


@pytest.mark.parametrize("case", cases(), ids=lambda c: c["name"])
def test_vector(case, participant, schema, conn):
    part, armed = participant
    saga_id = "vector-" + case["name"]
    crashes = any((s.get("payload") or {}).get("crash") for s in case["sends"] if isinstance(s.get("payload"), dict))
    if crashes:
        armed.add(saga_id)
    poisoned = set()
    for i, r in enumerate(records(case, saga_id)):
        try:
            out = part.handle(conn, r)
        except Crashed:
            out = part.handle(conn, r)  # the record comes again
        if out.kind == "poisoned":
            poisoned.add(i)
    assert not armed, "the crash point was not reached"
    rows = conn.execute(
        f"SELECT partition_key, event_type, headers, payload::text FROM {p.table(schema, 'outbox_event')} "
        "WHERE partition_key = %s AND event_type = 'saga.reply' ORDER BY id", (saga_id,)).fetchall()
    replies = [{"key": k, "event_type": et, "headers": h, "payload": pl} for k, et, h, pl in rows]
    effects = [tuple(r) for r in conn.execute(
        f"SELECT step, operation, amount FROM {p.table(schema, 'conform_effect')} WHERE saga_id = %s", (saga_id,))]
    assert check(case, saga_id, replies, effects, poisoned) == []
    # A poisoned record goes to the poison topic through the outbox, with its reason.
    n = conn.execute(f"SELECT count(*) FROM {p.table(schema, 'outbox_event')} WHERE topic = 'conform.commands.poison' "
                     "AND headers ? 'reason_poisoned'").fetchone()[0]
    assert n == len(poisoned)


def test_derived_values():
    for k in vectors("idempotency_keys.json")["keys"]:
        assert p.idempotency_key(k["saga_id"], k["step"], k["operation"]) == k["key"]
    ob = vectors("outbox.json")
    for l in ob["lanes"]:
        assert p.lane(l["partition_key"]) == l["lane"]
    for c in ob["channels"]:
        assert p.notify_channel(c["schema"]) == c["channel"]
    for r in ob["record_event_ids"]:
        assert p.record_event_id(r["topic"], r["partition"], r["offset"]) == r["event_id"]
