"""Session admin (issue 12): the session list (pages, search, sort, tenants), compact now
(202, then 409 while it runs, 422 when there is nothing to cut), the archive's pages, and a
delete after which ``/stats`` counts what is left and nothing of the session remains.
Real API, worker, Redis, SQLite and PostgreSQL; the summarizer is the stub LLM."""

from __future__ import annotations

import uuid

import httpx
import pytest
import sqlalchemy as sa
from stack import Stack, wait_for

#: As tests/integration/test_api_pipeline.py: these tests share its stacks.
CASE_SETTINGS = {
    "SUMMARIZATION_THRESHOLD_CHARS": "30000",
    "SUMMARIZATION_KEEP_CHARS": "10000",
    "SUMMARIZATION_TIMEOUT_S": "30",
}


def turn(i: int, chars: int) -> list[dict]:
    """One turn: a question, a tool call, its result of about ``chars`` chars, an answer."""
    lines = "\n".join(
        f"10:{j % 60:02d} checkout-api p99={400 + j}ms req={i}-{j}" for j in range(chars // 40)
    )
    return [
        {"type": "human", "id": f"h{i}", "content": f"question {i}: why is checkout slow?"},
        {
            "type": "ai",
            "id": f"a{i}",
            "content": "",
            "tool_calls": [{"id": f"c{i}", "name": "get_logs", "args": {"turn": i}}],
        },
        {"type": "tool", "id": f"t{i}", "tool_call_id": f"c{i}", "content": lines},
        {"type": "ai", "id": f"r{i}", "content": f"answer {i}: latency rose after the deploy"},
    ]


def client(stack: Stack, key: str) -> httpx.Client:
    c = httpx.Client(base_url=stack.url, timeout=30, headers={"Authorization": f"Bearer {key}"})
    stack.clients.append(c)
    return c


def post_turns(http: httpx.Client, session: str, turns: int, chars: int, start: int = 0) -> None:
    for i in range(start, start + turns):
        r = http.post(f"/sessions/{session}/turns", json={"messages": turn(i, chars)})
        assert r.status_code == 200, r.text


def all_pages(http: httpx.Client, **params) -> list[dict]:
    rows, cursor, pages = [], None, 0
    while True:
        r = http.get("/sessions", params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["sessions"]) <= params.get("limit", 50)
        rows += body["sessions"]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return rows
        assert pages < 50


def test_sessions_list_pages_sorts_searches_and_keeps_tenants_apart(stacks):
    stack = stacks.get("sqlite", **CASE_SETTINGS)
    run = uuid.uuid4().hex[:6]
    alice = client(stack, stack.create_key(f"alice-{run}"))
    bob = client(stack, stack.create_key(f"bob-{run}"))
    mine = {f"ls-{run}-{n}": n for n in range(1, 6)}  # session -> turns (sizes differ)
    for session, n in mine.items():
        post_turns(alice, session, n, 1_000)
    post_turns(bob, f"ls-{run}-bob", 1, 1_000)

    def sized() -> list[dict] | None:
        rows = all_pages(alice, limit=2)
        return rows if all(r["chars"] is not None for r in rows) and len(rows) == 5 else None

    rows = wait_for(sized, timeout=20)  # the size is recorded after the response
    assert {r["session_id"] for r in rows} == set(mine)  # alice's, all of them, once
    for r in rows:
        thread = alice.get(f"/sessions/{r['session_id']}/messages").json()
        assert (r["messages"], r["chars"]) == (len(thread["messages"]), thread["chars"])
        assert r["tenant"] == f"alice-{run}" and r["compactions"] == 0
        assert r["jobs_in_flight"] == 0 and r["last_activity"]
    # the default order: the latest activity first
    assert [r["session_id"] for r in rows] == sorted(mine, key=mine.get, reverse=True)
    by_chars = all_pages(alice, sort="chars", limit=3)
    assert [r["chars"] for r in by_chars] == sorted(r["chars"] for r in rows)
    by_id = all_pages(alice, sort="-session_id", limit=4)
    assert [r["session_id"] for r in by_id] == sorted(mine, reverse=True)
    found = alice.get("/sessions", params={"q": f"{run}-3"}).json()["sessions"]
    assert [r["session_id"] for r in found] == [f"ls-{run}-3"]
    assert alice.get("/sessions", params={"q": "%"}).json()["sessions"] == []  # no wildcard
    # an admin sees both tenants; bob only his own
    admin = {r["session_id"] for r in all_pages(stack.http, q=f"ls-{run}", limit=200)}
    assert admin == set(mine) | {f"ls-{run}-bob"}
    assert [r["session_id"] for r in bob.get("/sessions").json()["sessions"]] == [f"ls-{run}-bob"]
    # another tenant's session is 404 for every admin route, and stays as it was
    theirs = f"ls-{run}-5"
    assert bob.delete(f"/sessions/{theirs}").status_code == 404
    assert bob.post(f"/sessions/{theirs}/compact").status_code == 404
    assert bob.get(f"/sessions/{theirs}/archive").status_code == 404
    assert bob.get(f"/sessions/{theirs}/stats").status_code == 404
    assert alice.get(f"/sessions/{theirs}/messages").status_code == 200
    # bad input: one line, 422
    cursor = alice.get("/sessions", params={"limit": 1}).json()["next_cursor"]
    for params in (
        {"cursor": "not-a-cursor"},
        {"cursor": cursor, "sort": "chars"},  # a cursor of another sort order
        {"sort": "size"},
        {"limit": 0},
    ):
        r = alice.get("/sessions", params=params)
        assert r.status_code == 422 and isinstance(r.json()["detail"], str), (params, r.text)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_compact_now_archive_pages_and_delete_keeps_stats_right(stacks, stub, backend):
    stack = stacks.get(backend, **CASE_SETTINGS)
    run = uuid.uuid4().hex[:6]
    tenant = f"adm-{run}"
    http = client(stack, stack.create_key(tenant))
    first, second = f"cn-{run}-1", f"cn-{run}-2"
    # 5 turns of ~4,000 chars: under the prepare floor (24,000), so no job of its own
    post_turns(http, first, 5, 4_000)
    post_turns(http, second, 5, 4_000)
    assert stack.jobs(first) == []

    stub.state.gate.clear()  # the summarizer call waits: the job stays in flight
    try:
        r = http.post(f"/sessions/{first}/compact")
        assert r.status_code == 202, r.text
        job = r.json()
        assert job["status"] == "queued" and job["job_id"]
        wait_for(lambda: stub.state.requests, timeout=20)  # the worker is summarizing
        again = http.post(f"/sessions/{first}/compact")
        assert again.status_code == 409 and job["job_id"] in again.json()["detail"]
        busy = http.delete(f"/sessions/{first}")
        assert busy.status_code == 409, busy.text
    finally:
        stub.state.gate.set()
    jobs = stack.settle(first, expect_new_job=False, known=1, final=job["job_id"])
    (done,) = jobs
    assert done["status"] == "applied" and done["summarizer"].startswith("llm"), done
    assert done["latency_ms"] is not None and done["chars_removed"] > 0

    # the archive, page by page: every removed original once, in thread order
    removed = done["messages_removed"]
    pages, cursor = [], None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        body = http.get(f"/sessions/{first}/archive", params=params).json()
        assert body["total"] == removed
        pages += body["messages"]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert len(pages) == removed
    assert [m["message_id"] for m in pages] == [
        f"{k}{i}" for i in range(removed // 4 + 1) for k in "hatr"
    ][:removed]
    assert [m["position"] for m in pages] == sorted(m["position"] for m in pages)
    summary = http.get(f"/sessions/{first}/messages").json()["messages"][0]
    assert {m["summary_id"] for m in pages} == {summary["id"]}
    tool = next(m for m in pages if m["type"] == "tool")
    assert tool["content"].startswith("10:00 checkout-api") and tool["tool_call_id"]
    call = next(m for m in pages if m["tool_calls"])
    assert call["tool_calls"][0]["name"] == "get_logs"
    assert http.get(f"/sessions/{first}/archive", params={"summary_id": "nope"}).json() == {
        "session_id": first,
        "messages": [],
        "total": 0,
        "next_cursor": None,
    }
    assert http.get(f"/sessions/{first}/archive", params={"cursor": "xyz"}).status_code == 422

    # nothing left to cut: 422 with the planner's reason, and no job
    r = http.post(f"/sessions/{first}/compact")
    assert r.status_code == 422 and "nothing to compact" in r.json()["detail"], r.text
    assert len(stack.jobs(first)) == 1

    # the second session compacted too; then the first is deleted
    r = http.post(f"/sessions/{second}/compact")
    assert r.status_code == 202, r.text
    stack.settle(second, expect_new_job=False, known=1, final=r.json()["job_id"])
    before = http.get("/stats").json()["summary"]
    assert before["total_summarizations"] == 2 and before["sessions_compacted"] == 2
    assert before["llm_tokens"]["input"] > 0 and before["llm_tokens"]["events"] == 2
    assert before["summarizer_latency_ms"]["count"] == 2
    assert before["lag_ms"]["count"] == 2 and before["lag_ms"]["p99"] >= before["lag_ms"]["p50"]
    kept = http.get(f"/sessions/{second}/stats").json()
    assert kept["summary"]["total_summarizations"] == 1

    assert http.delete(f"/sessions/{first}").status_code == 204
    after = http.get("/stats").json()["summary"]
    for field in (
        "total_summarizations",
        "total_chars_compacted",
        "sessions_compacted",
        "approx_tokens_saved",
        "jobs",
        "llm_tokens",
    ):
        assert after[field] == kept["summary"][field], field
    assert after["jobs"]["applied"] == 1
    for path in ("messages", "compactions", "archive", "stats"):
        assert http.get(f"/sessions/{first}/{path}").status_code == 404, path
    assert http.delete(f"/sessions/{first}").status_code == 404
    assert [r["session_id"] for r in http.get("/sessions").json()["sessions"]] == [second]
    engine = sa.create_engine(stack.db_url())
    try:
        with engine.connect() as conn:
            for table in ("usage_events", "compaction_jobs", "archive", "sessions"):
                n = conn.execute(
                    sa.text(f"SELECT count(*) FROM {table} WHERE session_id = :s"), {"s": first}
                ).scalar()
                assert n == 0, table
    finally:
        engine.dispose()
    # the session id is free again: a new session, with a new owner
    post_turns(client(stack, stack.create_key(f"other-{run}")), first, 1, 100)


def test_stats_time_windows(stacks):
    stack = stacks.get("sqlite", **CASE_SETTINGS)
    http = stack.http
    everything = http.get("/stats").json()["summary"]
    assert everything["since"] is None
    assert (
        http.get("/stats", params={"since": "9999d"}).json()["summary"]["total_summarizations"]
        == everything["total_summarizations"]
    )
    future = http.get("/stats", params={"since": "2999-01-01T00:00:00Z"}).json()["summary"]
    assert future["total_summarizations"] == 0 and sum(future["jobs"].values()) == 0
    assert future["since"].startswith("2999-01-01T00:00:00")
    recent = http.get("/stats", params={"since": "1h"}).json()["summary"]
    assert recent["total_summarizations"] <= everything["total_summarizations"]
    for bad in ("yesterday", "1y", "-5m", "2026-13-01"):
        r = http.get("/stats", params={"since": bad})
        assert r.status_code == 422 and "since" in r.json()["detail"], bad
