"""examples/own_agent.py, a team's own create_agent app with its own PostgresSaver, runs with
offpath added in two lines (issue 9, item 4): the worker prepares from the agent's
checkpointer, the middleware applies at the next run's first model call, and offpath
never writes that checkpointer itself.

Issue 21: the agent's threads are sessions of kind ``own agent`` for the tenant the middleware
names (listed, read and compacted like the API's, invisible to other tenants); compact now
queues a job the middleware applies at the thread's next model call, and
``GET /sessions/{id}/events`` streams its progress as server-sent events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from shared import marked_summary, pairing_problems
from stack import (
    REDIS_URL,
    ROOT,
    Stack,
    create_pg_database,
    drop_pg_database,
    wait_for,
)

from offpath.agent.scripted import DEMO_REQUESTS
from offpath.stores.checkpoints import open_checkpoints_url, read_messages

pytestmark = pytest.mark.usefixtures("stub")


def test_own_agent_example_compacts_in_its_own_checkpointer(stacks):
    text = (ROOT / "examples" / "own_agent.py").read_text()
    assert text.count("# offpath") <= 5, "offpath takes at most 5 lines of the app"
    stack = stacks.get("postgres", llm=False, JOB_LEASE_S="3", RECONCILE_INTERVAL_S="2")
    agent_db = create_pg_database("offpath_test_own")
    thread = f"own-{uuid.uuid4().hex[:6]}"
    env = {
        **stack.env,
        "OPENAI_API_KEY": "",
        "OPENAI_BASE_URL": "",  # the example's model: offpath's scripted one
    }

    def run(*questions: str, thread: str = thread, **more_env: str) -> str:
        result = subprocess.run(
            [sys.executable, "examples/own_agent.py", "--db", agent_db, "--thread", thread]
            + list(questions),
            cwd=ROOT,
            env={**env, **more_env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    try:
        out = run(*DEMO_REQUESTS)  # ~158,000 chars of tool output: past the threshold
        assert "[scripted model]" in out
        wait_for(
            lambda: any(j["status"] in ("prepared", "applied") for j in stack.jobs(thread)),
            timeout=60,
        )
        # the next run's first model call applies what was prepared, unless the check before
        # the swap (DESIGN.md invariant 16) finds that messages the first run wrote after the
        # summary name what only the removed part held: then the job ends skipped (stale) and
        # a fresh one is prepared for the run after
        for question in ("Summarize where we are.", "What next?", "Anything else?"):
            run(question)
            jobs = stack.jobs(thread)
            if any(j["status"] == "applied" for j in jobs):
                break
            wait_for(lambda: any(j["status"] == "prepared" for j in stack.jobs(thread)), 60)
        jobs = wait_for(
            lambda: (
                [j for j in stack.jobs(thread) if j["status"] == "applied"] and stack.jobs(thread)
            ),
            timeout=60,
        )
        assert not [j for j in jobs if j["status"] == "failed"], jobs
        assert all(j["reason_code"] == "stale" for j in jobs if j["status"] == "skipped"), jobs
        with psycopg.connect(agent_db) as conn:
            sources = {
                row[0]
                for row in conn.execute(
                    "SELECT metadata->>'source' FROM checkpoints WHERE thread_id = %s", (thread,)
                )
            }
        assert "update" not in sources, "offpath wrote the agent's checkpointer"
        # issue 21, item 1: the thread is a session of kind "own agent", of tenant "default"
        # (OWN_AGENT_TENANT's default), read from the agent's checkpointer
        own = stack.http.get(f"/sessions/{thread}/messages").json()
        assert own["kind"] == "own agent" and own["messages"], own
        (row,) = stack.http.get("/sessions", params={"q": thread}).json()["sessions"]
        assert (row["kind"], row["tenant"]) == ("own agent", "default"), row
        assert row["chars"] and row["compactions"] >= 1, row
        mine = {"Authorization": f"Bearer {stack.create_key('default')}"}
        other = {"Authorization": f"Bearer {stack.create_key('other-team')}"}
        listed = stack.http.get("/sessions", params={"q": thread}, headers=mine).json()
        assert [r["session_id"] for r in listed["sessions"]] == [thread]
        assert not stack.http.get("/sessions", headers=other).json()["sessions"]
        for path in ("messages", "compactions", "events"):
            r = stack.http.get(f"/sessions/{thread}/{path}", headers=other)
            assert r.status_code == 404, (path, r.status_code)
        assert stack.http.post(f"/sessions/{thread}/compact", headers=other).status_code == 404
        r = stack.http.post(
            f"/sessions/{thread}/turns", json={"messages": [{"type": "human", "content": "hi"}]}
        )
        assert r.status_code == 409 and "own agent" in r.json()["detail"], r.text
        # the web UI shows it to an admin, read from the agent's checkpointer (issue 12)
        page = stack.http.get(f"/ui/sessions/{thread}")
        assert page.status_code == 200 and 'class="msg human summary"' in page.text
        assert 'data-kind="own agent"' in page.text  # marked as such, in the list too
        listed_ui = stack.http.get("/ui/sessions", params={"q": thread}, headers=mine)
        assert f'tr data-session="{thread}"' in listed_ui.text
        assert 'data-kind="own agent"' in listed_ui.text
        with open_checkpoints_url(agent_db, stack.settings()) as checkpoints:
            messages = read_messages(checkpoints.saver, thread)
        body = [m for m in messages if m.type != "system"]
        assert marked_summary(body[0]) and sum(marked_summary(m) for m in body) == 1
        assert not pairing_problems(body)
        figures_reach_the_api(stack, thread, jobs)

        # compact now on an own agent's thread under its threshold (issue 21, item 1): the
        # worker prepares, the middleware applies at the thread's next model call; the
        # progress streams as server-sent events (item 4). The run's middleware is told a
        # threshold it never reaches, so that it queues no job of its own.
        second = f"{thread}-now"
        never = {"SUMMARIZATION_THRESHOLD_CHARS": "10000000"}
        run(DEMO_REQUESTS[1], DEMO_REQUESTS[4], thread=second, **never)
        assert not stack.jobs(second)
        # with no job yet it reads like any session, from the agent's checkpointer: its
        # compactions (none) and its figures now
        r = stack.http.get(f"/sessions/{second}/compactions", headers=mine)
        assert r.status_code == 200 and r.json()["jobs"] == [], r.text
        shown = stack.http.get(f"/sessions/{second}/messages", headers=mine).json()
        figures = stack.http.get(f"/sessions/{second}/stats", headers=mine).json()
        assert shown["messages"] and figures["messages"] == len(shown["messages"]), figures
        assert figures["chars"] == shown["chars"] and figures["tokens"], figures
        updates: list[dict[str, Any]] = []
        reader = threading.Thread(
            target=read_events, args=(stack.url, mine, second, updates), daemon=True
        )
        reader.start()
        wait_for(lambda: updates, timeout=30)  # the stream is open (its first line came)
        r = stack.http.post(f"/sessions/{second}/compact", headers=mine)
        assert r.status_code == 202, r.text
        done = r.json()
        assert (done["status"], done["kind"]) == ("queued", "own agent"), done
        assert "next model call" in done["detail"]
        wait_for(lambda: [j["status"] for j in stack.jobs(second)] == ["prepared"], timeout=60)
        before = stack.session(second)["chars"]
        run("What next?", thread=second, **never)
        (job,) = wait_for(
            lambda: [j for j in stack.jobs(second) if j["status"] == "applied"], timeout=30
        )
        assert job["job_id"] == done["job_id"]
        reader.join(timeout=30)
        seen = [u["update"] for u in updates[1:]]
        assert {u["compactionId"] for u in seen} == {done["job_id"]}, updates
        assert [u["status"] for u in seen] == ["in_progress", "completed"], seen
        assert all(u["sessionUpdate"] == "compaction_update" for u in seen)
        assert seen[1]["charsAfter"] < seen[1]["charsBefore"], seen
        assert seen[1]["charsBefore"] >= before  # the thread at the next run's call
        assert all(u.get("sessionId") == second and u["at"] for u in updates[1:])
    finally:
        drop_pg_database(agent_db)


def read_events(url: str, headers: dict[str, str], session: str, out: list[Any]) -> None:
    """Read ``GET /sessions/{session}/events`` over HTTP until an update is ``completed``
    (or ``failed``/``cancelled``): ``out`` gets the status line first, then each event's
    data."""
    timeout = httpx.Timeout(10, read=120)
    with httpx.Client(base_url=url, headers=headers, timeout=timeout) as client:
        with client.stream("GET", f"/sessions/{session}/events") as r:
            out.append({"status": r.status_code, "type": r.headers.get("content-type")})
            if r.status_code != 200:
                return
            for line in r.iter_lines():
                if line.startswith("data: "):
                    out.append(json.loads(line.removeprefix("data: ")))
                    if out[-1]["update"]["status"] != "in_progress":
                        return


def figures_reach_the_api(stack, thread: str, jobs: list[dict]) -> None:
    """Issue 21, item 6: what the app's middleware did (it serves no metrics) is on the API's
    /metrics, read from the rows it wrote; each compaction's size just before it was applied
    is on its job row, and the dashboard's size chart draws that peak."""
    import json

    from integration.test_metrics import rows, scrape, total

    def obj(value):
        return value if isinstance(value, dict) else json.loads(value)

    api = scrape(f"{stack.url}/metrics", stack.key)
    events = [obj(m) for (m,) in rows(stack, "SELECT metadata FROM usage_events")]
    (maskings,) = rows(stack, "SELECT count(*) FROM fallback_maskings")
    assert total(api, "offpath_compactions_total") == len(events) >= 1
    saved = sum(e["chars_saved"] for e in events)
    assert total(api, "offpath_chars_saved_total") == saved > 0
    assert stack.http.get("/stats").json()["summary"]["total_chars_compacted"] == saved
    assert total(api, "offpath_fallback_maskings_total") == maskings[0]
    threshold = stack.settings().summarization_threshold_chars
    dashboard = stack.http.get("/ui/")
    assert dashboard.status_code == 200
    for job in (j for j in jobs if j["status"] == "applied"):
        peak = job["chars_at_apply"]
        assert peak > threshold and 0 < job["chars_saved"] < peak, job
        assert f"{thread}: {peak:,} chars job {job['job_id'][:8]} applied: before" in (
            dashboard.text
        )


def test_own_agent_before_migrate_and_any_worker_says_what_is_missing_then_recovers(
    stacks, tmp_path
):
    """Issue 35, items 1 and 2: a team's agent started on a fresh clone's order (before
    `offpath migrate`, before any worker) makes offpath's tables itself and prints no SQL;
    once its job has waited PICKUP_WARN_S, a run says in one line that no worker takes it,
    naming the queue and the broker; a wrong DATABASE_URL and an unreachable Redis are one
    line each, naming them. Once a worker runs, the job is prepared and a later run applies
    it (or, found stale, a fresh one), with nothing restarted."""
    from offpath.agent.middleware.claims import PICKUP_WARN_S

    usage_db = create_pg_database("offpath_test_fresh")  # never migrated
    agent_db = create_pg_database("offpath_test_own")
    queue = f"test-fresh-{uuid.uuid4().hex[:8]}"
    thread = f"fresh-{uuid.uuid4().hex[:6]}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SUMMARIZATION_", "OPENAI_"))}
    env = {
        **base,
        "DATABASE_URL": usage_db,
        "REDIS_URL": REDIS_URL,
        "CELERY_QUEUE": queue,
        "REDIS_KEY_PREFIX": queue,
        "DATA_DIR": str(tmp_path),
        "OPENAI_API_KEY": "",
        "OPENAI_BASE_URL": "",
    }

    def run(*questions: str, **more: str) -> list[str]:
        """The run's log lines (stderr; the answers go to stdout)."""
        result = subprocess.run(
            [sys.executable, "examples/own_agent.py", "--db", agent_db, "--thread", thread]
            + list(questions),
            cwd=ROOT,
            env={**env, **more},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stderr.splitlines()

    def jobs() -> list[tuple[str, str, Any]]:
        with psycopg.connect(usage_db) as conn:
            return conn.execute(
                "SELECT job_id, status, created_at FROM compaction_jobs WHERE session_id = %s",
                (thread,),
            ).fetchall()

    def reasons() -> list[tuple[str, str, Any]]:
        """Each job's status and why, in the order queued (what a failure shows)."""
        with psycopg.connect(usage_db) as conn:
            return conn.execute(
                "SELECT status, reason_code, reason FROM compaction_jobs WHERE session_id = %s"
                " ORDER BY created_at",
                (thread,),
            ).fetchall()

    stack = None
    try:
        lines = run(*DEMO_REQUESTS)
        assert not [line for line in lines if "SQL" in line or "does not exist" in line], lines
        assert len(lines) <= 2, lines  # at most the calibration's note: no error
        ((job_id, status, created),) = jobs()  # made the tables, recorded and queued its job
        assert status == "queued"
        time.sleep(max(0.0, created.timestamp() + PICKUP_WARN_S - time.time()))
        lines = run("Summarize where we are.")
        said = [line for line in lines if "no worker has taken it" in line]
        assert len(said) == 1 and len(lines) <= 3, lines
        assert job_id in said[0] and f"queue {queue!r}" in said[0], said
        assert f"broker at {REDIS_URL}" in said[0] and "offpath worker" in said[0], said

        missing = usage_db.rsplit("/", 1)[0] + "/offpath_test_never_created"
        lines = run("What next?", DATABASE_URL=missing)
        named = [line for line in lines if "cannot be reached" in line]
        assert len(named) == 1 and len(lines) <= 3, lines
        assert f"usage database at {missing}" in named[0] and "does not exist" in named[0]
        lines = run("What next?", REDIS_URL="redis://127.0.0.1:1/0")
        named = [line for line in lines if "cannot be reached" in line]
        assert len(named) == 1 and len(lines) <= 3, lines
        assert "lease store at redis://127.0.0.1:1/0" in named[0], named

        # a worker (and the API) on the same database and queue: the job waiting is taken
        same = {"DATABASE_URL": usage_db, "CELERY_QUEUE": queue, "REDIS_KEY_PREFIX": queue}
        stack = Stack("sqlite", tmp_path, same, beat=False)
        wait_for(lambda: [s for _, s, _ in jobs()] == ["prepared"], timeout=120)
        # as in the test above: a run applies it, or finds it stale and a fresh one is
        # queued (by that run or the next) and prepared for a later run; each run waits for
        # the worker to have taken what the one before queued
        said: list[str] = []
        for question in ("Anything else?", "And now?", "Last question.", "One more."):
            said += [f"{question!r}: {line}" for line in run(question)]
            if "applied" in [s for _, s, _ in jobs()]:
                break
            try:
                wait_for(lambda: not {s for _, s, _ in jobs()} & {"queued", "running"}, timeout=120)
            except AssertionError:
                pytest.fail(f"a job stays open: {reasons()}; the runs said {said}")
        assert "applied" in [s for _, s, _ in jobs()], (reasons(), said)
    finally:
        if stack is not None:
            stack.stop()
        drop_pg_database(agent_db)
        drop_pg_database(usage_db)


def test_an_own_agents_run_stores_each_messages_facts_and_its_job_reads_them(stacks):
    """Facts are found once per message: the middleware of a team's own agent stores the
    facts of each message of a run (those a model call is the first to see, the originals of
    results shortened as they arrived, the run's last answer) in the fact store, on its facts
    thread; the worker's job that removes them reads them there and finds none itself."""
    import redis
    import sqlalchemy as sa
    from langchain_core.messages import messages_from_dict

    from offpath.compaction.facts.extraction import key_digest
    from offpath.compaction.shorten import is_shortened
    from offpath.compaction.summary import is_summary
    from offpath.stores import archive

    stack = stacks.get("postgres", llm=False, JOB_LEASE_S="3", RECONCILE_INTERVAL_S="2")
    agent_db = create_pg_database("offpath_test_own")
    thread = f"facts-{uuid.uuid4().hex[:6]}"
    env = {**stack.env, "OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""}
    conn = redis.Redis.from_url(REDIS_URL)
    engine = sa.create_engine(stack.db_url())
    try:
        result = subprocess.run(
            [sys.executable, "examples/own_agent.py", "--db", agent_db, "--thread", thread]
            + list(DEMO_REQUESTS),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        wait_for(
            lambda: any(j["status"] in ("prepared", "applied") for j in stack.jobs(thread)),
            timeout=60,
        )
        with open_checkpoints_url(agent_db, stack.settings()) as checkpoints:
            messages = read_messages(checkpoints.saver, thread)
        # each message of the thread as it stands, or as it arrived if offpath shortened it
        # (the job reads that original from the archive), has its facts in the store
        arrived = []
        for m in (m for m in messages if not is_summary(m)):  # the worker wrote the summary
            original = is_shortened(m) and archive.original(engine, thread, str(m.id))
            arrived.append(messages_from_dict([original])[0] if original else m)
        prefix = stack.env["REDIS_KEY_PREFIX"]
        keys = [f"{prefix}:facts:{key_digest(m).hex()}" for m in arrived]
        assert len(arrived) > 10 and conn.exists(*keys) == len(keys)
        with engine.connect() as db:
            (first,) = db.execute(
                sa.text(
                    "SELECT result FROM compaction_jobs WHERE session_id = :s"
                    " AND result IS NOT NULL ORDER BY created_at LIMIT 1"
                ),
                {"s": thread},
            ).one()
        usage = first["usage"]  # the first job: no summary among what it removes
        assert usage["facts_read"] > 0 and usage["facts_found"] == 0, usage
    finally:
        conn.close()
        engine.dispose()
        drop_pg_database(agent_db)
