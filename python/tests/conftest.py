"""Fixtures: a fresh migrated schema in the PostgreSQL of DATABASE_URL (as
millrace's Go tests use one), and Kafka brokers: KAFKA_BROKERS, else the
embedded broker (cmd/millrace-kafka) started once for the session."""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import subprocess
import sys

import psycopg
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from millrace import protocol as p  # noqa: E402


def database_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if not url:
        pytest.exit("DATABASE_URL is not set: run scripts/pg-up.sh (make test does)", returncode=1)
    return url


def migrate(conn, schema: str) -> None:
    """Applies millrace's migrations to schema, as a user of goose would:
    each migrations/sql/NNN_*.up.sql with search_path set."""
    with conn.transaction():
        conn.execute(f"CREATE SCHEMA {p.check_schema(schema)}")
        conn.execute(f"SET LOCAL search_path TO {schema}")
        for f in sorted((ROOT / "migrations" / "sql").glob("*.up.sql")):
            conn.execute(f.read_text())


@pytest.fixture
def schema():
    name = "py_" + secrets.token_hex(6)
    with psycopg.connect(database_url(), autocommit=True) as conn:
        migrate(conn, name)
    yield name
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {name} CASCADE")


@pytest.fixture
def conn():
    with psycopg.connect(database_url(), autocommit=True) as c:
        yield c


@pytest.fixture(scope="session")
def brokers():
    b = os.environ.get("KAFKA_BROKERS")
    if b:
        yield b
        return
    binary = ROOT / ".pytest-millrace-kafka"
    subprocess.run(["go", "build", "-o", str(binary), "./cmd/millrace-kafka"], cwd=ROOT, check=True)
    proc = subprocess.Popen([str(binary), "-port", "0", "-in-memory"], stdout=subprocess.PIPE, text=True)
    try:
        addr = proc.stdout.readline().strip()
        yield addr
    finally:
        proc.terminate()
        proc.wait(10)
        binary.unlink(missing_ok=True)


def vectors(name: str):
    return json.loads((ROOT / "testdata" / "protocol" / name).read_text())


def cases():
    out = []
    for f in sorted((ROOT / "testdata" / "protocol" / "cases").glob("*.json")):
        out.append(json.loads(f.read_text()))
    return out
