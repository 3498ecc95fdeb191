"""What the usage tables' JSON columns store: orjson's text for plain values, ``json.dumps``'s
for the rest, the same values read back (a real SQLite usage database)."""

from __future__ import annotations

import enum
import json
import uuid

import pytest
import sqlalchemy as sa

from offpath.config import load_settings
from offpath.stores.db.engine import json_bytes, json_text, make_engine, migrate
from offpath.stores.db.tables import JOBS
from offpath.stores.db.transitions import create_job, store_result


class Color(enum.Enum):
    RED = 1


PLAIN = {
    "type": "ai",
    "data": {
        "content": "naïve café ✓ 502s since 10:30 UTC",
        "tool_calls": [{"id": "c1", "name": "kubectl_logs", "args": {"pod": "x", "n": 3}}],
        "usage": {"ratio": 3.75, "zero": -0.0, "big": 2**63 - 1, "ok": True, "none": None},
        "pair": (1, 2),
    },
}


def test_plain_values_are_written_by_orjson_and_read_back_the_same():
    out = json_bytes(PLAIN)
    assert isinstance(out, bytes)  # orjson's
    assert json.loads(out) == json.loads(json.dumps(PLAIN))
    assert json_text(PLAIN) == out.decode()


@pytest.mark.parametrize(
    "value",
    [
        {"a": [1, {"b": float("nan")}]},  # orjson would write null
        {"x": float("inf")},
        {"id": uuid.UUID(int=7)},  # json.dumps refuses it: still refused
        {"c": Color.RED},
        {1: "a key that is not a string"},
        {"s": "lone \ud800 surrogate"},
        {"n": 2**70},
    ],
    ids=["nan", "inf", "uuid", "enum", "int-key", "surrogate", "int-past-64-bits"],
)
def test_other_values_are_written_as_json_dumps_writes_them(value):
    try:
        expected = json.dumps(value)
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc)):
            json_bytes(value)
        return
    assert json_bytes(value) == expected
    assert json_text(value) == expected


def test_a_stored_result_reads_back_as_it_was_given(tmp_path):
    settings = load_settings(data_dir=str(tmp_path))
    migrate(settings)
    engine = make_engine(settings)
    try:
        create_job(engine, "j1", "s1", 100)
        store_result(engine, "j1", {"record": PLAIN, "nan": float("nan")})
        with engine.connect() as conn:
            stored = conn.execute(sa.select(JOBS.c.result).where(JOBS.c.job_id == "j1")).scalar()
        assert stored["record"] == json.loads(json.dumps(PLAIN))
        assert stored["nan"] != stored["nan"]  # NaN kept as SQLite's text holds it, not null
    finally:
        engine.dispose()


def test_the_lost_facts_of_a_sessions_applied_jobs_are_read_oldest_first(tmp_path):
    from offpath.stores.db.job_queries import lost_of
    from offpath.stores.db.tables import JobStatus

    settings = load_settings(data_dir=str(tmp_path))
    migrate(settings)
    engine = make_engine(settings)
    try:
        lost = {"j1": [{"value": "ledger-7", "said": True}], "j3": [{"value": "OPS-4711"}]}
        for job_id, status in (("j1", "applied"), ("j2", "failed"), ("j3", "applied")):
            create_job(engine, job_id, "s1", 100)
            loss = {"lost": lost[job_id]} if job_id in lost else {"error": "not made"}
            store_result(engine, job_id, {"record": {"loss": loss}}, JobStatus(status))
        create_job(engine, "j4", "s1", 100)  # applied, its report not there yet
        store_result(engine, "j4", {"record": {"loss": {"error": "x"}}}, JobStatus.APPLIED)
        create_job(engine, "k1", "s2", 100)  # another session's
        store_result(engine, "k1", {"record": {"loss": {"lost": [{"v": 1}]}}}, JobStatus.APPLIED)
        assert lost_of(engine, "s1") == [lost["j1"], lost["j3"], []]
        assert lost_of(engine, "s1", limit=2) == [lost["j3"], []]
    finally:
        engine.dispose()
