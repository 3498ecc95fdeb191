"""The loss report and undo of a compaction through the API (issue 19), on real processes and
both backends: ``GET /sessions/{id}/compactions`` shows each applied compaction's loss
report; ``POST /sessions/{id}/compactions/{job}/revert`` puts its originals back byte for
byte (``?format=langchain``: lossless) with later messages untouched, refuses with 409 what
it cannot do now (a job in flight, a summary folded into a later compaction, a job reverted
already) and with 404 another tenant's session or an unknown job; the session page shows
the report and a Revert button; ``offpath revert`` does the same from the command line."""

from __future__ import annotations

import uuid

import pytest
from stack import wait_for

from .test_cli import run
from .test_metrics import scrape, total
from .test_openai_import import SMALL

pytestmark = pytest.mark.usefixtures("stub")


def turn(k: int, rows: int = 60) -> list[dict]:
    call = f"call-{k}-{uuid.uuid4().hex[:6]}"
    return [
        {"type": "human", "content": f"check shard {k} of ledger-db (ticket OPS-{900 + k})"},
        {
            "type": "ai",
            "content": "",
            "tool_calls": [{"id": call, "name": "logs", "args": {"shard": f"ledger-db-{k}"}}],
        },
        {
            "type": "tool",
            "tool_call_id": call,
            "content": f"ledger-db-{k}: replication lag {k * 10}s\n" + "row ok\n" * rows,
        },
        {"type": "ai", "content": f"Shard {k} lags {k * 10}s."},
    ]


def lossless(stack, session: str) -> list[dict]:
    r = stack.http.get(f"/sessions/{session}/messages", params={"format": "langchain"})
    r.raise_for_status()
    return r.json()["messages"]


def applied(stack, session: str, job_id: str) -> dict:
    """Job ``job_id`` once it is final (it must end applied)."""
    jobs = stack.settle(session, False, 0, final=job_id)
    job = next(j for j in jobs if j["job_id"] == job_id)
    assert job["status"] == "applied", job
    return job


def compact_now(stack, session: str) -> str:
    r = stack.http.post(f"/sessions/{session}/compact")
    assert r.status_code == 202, r.text
    return r.json()["job_id"]


def revert(stack, session: str, job_id: str):
    return stack.http.post(f"/sessions/{session}/compactions/{job_id}/revert")


def started(stack, turns: int = 4) -> tuple[str, list[dict]]:
    """A session under its threshold (nothing applies by itself), and its thread."""
    session = f"rv-{uuid.uuid4().hex[:8]}"
    for k in range(turns):
        assert stack.post_turn(session, turn(k)).status_code == 200
    stack.settle(session, False, 0)
    return session, lossless(stack, session)


def test_compact_then_revert_through_the_api(stacks, backend):
    stack = stacks.get(backend, **SMALL)
    session, before = started(stack)
    job_id = compact_now(stack, session)
    job = applied(stack, session, job_id)
    loss = job["loss"]
    assert loss["messages_removed"] == job["messages_removed"] > 0
    # the summary (its pins, its archive index) may hold every fact of so small a session
    assert loss["facts"] > 0 and loss["facts"] >= loss["facts_lost"] == len(loss["lost"])
    assert all({"value", "kind", "message_id"} == set(f) for f in loss["lost"])
    assert lossless(stack, session) != before
    later = turn(9, rows=2)
    assert stack.post_turn(session, later).status_code == 200
    grown = lossless(stack, session)

    page = stack.http.get(f"/ui/sessions/{session}").text
    assert f'data-job="{job_id}"' in page and "facts lost" in page

    counters = scrape(f"{stack.url}/metrics", stack.key)
    r = revert(stack, session, job_id)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "reverted" and body["messages_restored"] == job["messages_removed"]
    # the counters keep the compaction (it happened) and count its revert beside it
    after = scrape(f"{stack.url}/metrics", stack.key)
    for name, grew in (
        ("offpath_compactions_reverted_total", 1),
        ("offpath_chars_restored_total", job["chars_saved"]),
    ):
        assert total(after, name) - total(counters, name) == grew, name
    now = lossless(stack, session)
    assert now == before + grown[-len(later) :]  # the originals, then what came since
    assert body["messages"] == len(now)
    jobs = stack.http.get(f"/sessions/{session}/compactions").json()
    mine = next(j for j in jobs["jobs"] if j["job_id"] == job_id)
    assert (mine["status"], mine["reason_code"]) == ("reverted", "reverted")
    # its originals are back: nothing saved, nothing lost (issue 32, item 6)
    assert (mine["chars_saved"], mine["chars_removed"], mine["messages_removed"]) == (0, 0, 0)
    assert (mine["loss"]["facts"], mine["loss"]["facts_lost"], mine["loss"]["lost"]) == (0, 0, [])
    assert jobs["lease"] == {"job_id": job_id, "state": "skipped"}  # no new job at once
    page = stack.http.get(f"/ui/sessions/{session}").text
    assert f'data-job="{job_id}"' not in page and "reverted" in page
    assert "nothing saved, nothing lost" in page and "facts lost" not in page

    r = revert(stack, session, job_id)
    assert r.status_code == 409 and "reverted already" in r.json()["detail"]
    assert revert(stack, session, "no-such-job").status_code == 404
    other = stack.create_key(f"other-{uuid.uuid4().hex[:6]}")
    r = stack.http.post(
        f"/sessions/{session}/compactions/{job_id}/revert",
        headers={"Authorization": f"Bearer {other}"},
    )
    assert r.status_code == 404


def test_what_cannot_be_reverted_now_gets_409_saying_why(stacks, backend, stub):
    stack = stacks.get(backend, **SMALL)
    session, before = started(stack)
    first = compact_now(stack, session)
    applied(stack, session, first)
    after_first = lossless(stack, session)
    for k in range(4, 9):  # small turns: the thread stays under its prepare floor
        assert stack.post_turn(session, turn(k, rows=8)).status_code == 200
    stack.settle(session, False, 0)
    assert all(j["status"] == "applied" for j in stack.jobs(session))
    stub.state.gate.clear()  # the next job's summarizer call waits: the job holds the thread
    try:
        second = compact_now(stack, session)
        r = revert(stack, session, first)
        assert r.status_code == 409 and "on this session" in r.json()["detail"], r.text
    finally:
        stub.state.gate.set()
    applied(stack, session, second)
    grown_then_compacted = lossless(stack, session)
    r = revert(stack, session, first)
    assert r.status_code == 409 and f"job {second}) folded it in" in r.json()["detail"], r.text
    assert lossless(stack, session) == grown_then_compacted  # a refusal changes nothing
    # the later one first, named as `offpath show` prints it (its id's first 12 chars);
    # then the earlier summary is the latest and goes too (CLI)
    wrong = run(["revert", session, "not-a-job", "--url", stack.url, "--api-key", stack.key])
    assert wrong.returncode == 1 and "no job 'not-a-job'" in wrong.stderr, wrong.stderr
    shown = run(["revert", session, second[:12], "--url", stack.url, "--api-key", stack.key])
    assert shown.returncode == 0 and f"job {second} reverted" in shown.stdout, shown.stderr
    assert lossless(stack, session)[: len(after_first)] == after_first
    done = run(["revert", session, "--url", stack.url, "--api-key", stack.key])
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"job {first} reverted" in done.stdout
    assert lossless(stack, session)[: len(before)] == before
    nothing = run(["revert", session, "--url", stack.url, "--api-key", stack.key])
    assert nothing.returncode == 1 and "no applied compaction" in nothing.stderr
    wait_for(lambda: stack.http.get("/stats").json()["summary"]["jobs"]["reverted"] >= 2)


def group(k: int, rows: int) -> list[dict]:
    """One tool call and its result."""
    call = f"g-{k}-{uuid.uuid4().hex[:6]}"
    return [
        {"type": "ai", "content": "", "tool_calls": [{"id": call, "name": "logs", "args": {}}]},
        {"type": "tool", "tool_call_id": call, "content": f"part {k}\n" + "row ok\n" * rows},
    ]


def test_a_long_request_copied_after_the_summary_comes_back_byte_for_byte(stacks, backend):
    """Between the prepare floor and the threshold the hook's job only prepares: the thread
    holds still until "compact now" applies it. (Kept results a compaction shortens come
    back too: ``tests/coordination/test_revert_units.py`` and the property test.)"""
    stack = stacks.get(backend, **SMALL)
    session = f"rv-{uuid.uuid4().hex[:8]}"
    ask = {"type": "human", "content": "investigate the checkout outage " * 12}
    assert (
        stack.post_turn(session, [ask, *[m for k in range(8) for m in group(k, 60)]]).status_code
        == 200
    )
    stack.settle(session, True, 0)  # over the prepare floor: the hook's job prepares
    before = lossless(stack, session)
    job_id = compact_now(stack, session)
    applied(stack, session, job_id)
    compacted = lossless(stack, session)
    # the request's copy follows the summary, with the second removed message's id
    assert compacted[1]["data"]["content"] == before[0]["data"]["content"]
    assert compacted[1]["data"]["id"] == before[1]["data"]["id"]
    later = turn(9, rows=2)
    assert stack.post_turn(session, later).status_code == 200
    r = revert(stack, session, job_id)
    assert r.status_code == 200, r.text
    now = lossless(stack, session)
    assert now[: len(before)] == before and len(now) == len(before) + len(later)


def test_a_loss_report_left_pending_is_made_by_the_reconciler(stacks, backend):
    """Issue 34, item 6: an in-run apply makes its loss report just after the swap; if the
    agent's process died in that moment the report stayed ``LOSS_PENDING`` for good. The
    reconciler (the stack's beat) makes it, from the archived originals, the summary and the
    thread: with nothing added since, the very report the swap made."""
    import sqlalchemy as sa

    from offpath.agent.middleware import LOSS_PENDING
    from offpath.stores.db.engine import make_engine
    from offpath.stores.db.tables import JOBS, now_utc

    stack = stacks.get(backend, **SMALL)
    session, _ = started(stack)
    job_id = compact_now(stack, session)
    made = applied(stack, session, job_id)["loss"]
    assert made["facts"] > 0
    engine = make_engine(stack.settings())
    try:  # the state the crash leaves: the record stored with the placeholder, the job applied
        with engine.begin() as conn:
            jobs = JOBS
            result = conn.execute(sa.select(jobs.c.result).where(jobs.c.job_id == job_id)).scalar()
            result = {**result, "record": {**result["record"], "loss": LOSS_PENDING}}
            quiet = now_utc().replace(year=2000)  # quiet for longer than a pass's interval
            conn.execute(
                sa.update(jobs)
                .where(jobs.c.job_id == job_id)
                .values(result=result, updated_at=quiet)
            )
    finally:
        engine.dispose()

    def loss() -> dict:
        return next(j for j in stack.jobs(session) if j["job_id"] == job_id)["loss"]

    assert wait_for(lambda: loss() != LOSS_PENDING, timeout=90)
    assert loss() == made
    assert "made the loss report of job" in stack.logs()


def test_a_reverted_jobs_reason_is_stored_as_every_other(stacks, backend):
    """Issue 34, item 6: ``mark_reverted`` stored its reason uncapped and unflattened, unlike
    every other status change: one line, at most 300 chars."""
    from offpath.stores.db.engine import make_engine
    from offpath.stores.db.tables import MAX_REASON_CHARS
    from offpath.stores.db.transitions import mark_reverted

    stack = stacks.get(backend, **SMALL)
    session, _ = started(stack)
    job_id = compact_now(stack, session)
    applied(stack, session, job_id)
    engine = make_engine(stack.settings())
    try:
        assert mark_reverted(engine, job_id, "reverted:\n" + "a long\treason " * 400)
    finally:
        engine.dispose()
    reason = next(j for j in stack.jobs(session) if j["job_id"] == job_id)["reason"]
    assert "\n" not in reason and "\t" not in reason and len(reason) == MAX_REASON_CHARS
    assert reason.startswith("reverted: a long reason a long reason")
