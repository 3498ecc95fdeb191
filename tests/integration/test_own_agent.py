"""examples/own_agent.py, a team's own create_agent app with its own PostgresSaver, runs with
offpath added in two lines (issue 9, item 4): the worker prepares from the agent's
checkpointer, the middleware applies at the next run's first model call, and offpath
never writes that checkpointer itself."""

from __future__ import annotations

import subprocess
import sys
import uuid

import psycopg
import pytest
from shared import marked_summary, pairing_problems
from stack import ROOT, create_pg_database, drop_pg_database, wait_for

from offpath.demo.scripted import DEMO_REQUESTS
from offpath.service.checkpoints import open_checkpoints_url
from offpath.service.compactions import read_messages

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

    def run(*questions: str) -> str:
        result = subprocess.run(
            [sys.executable, "examples/own_agent.py", "--db", agent_db, "--thread", thread]
            + list(questions),
            cwd=ROOT,
            env=env,
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
        assert stack.http.get(f"/sessions/{thread}/messages").status_code == 404  # not offpath's
        # the web UI shows it to an admin, read from the agent's checkpointer (issue 12)
        page = stack.http.get(f"/ui/sessions/{thread}")
        assert page.status_code == 200 and 'class="msg human summary"' in page.text
        with open_checkpoints_url(agent_db, stack.settings()) as checkpoints:
            messages = read_messages(checkpoints.saver, thread)
        body = [m for m in messages if m.type != "system"]
        assert marked_summary(body[0]) and sum(marked_summary(m) for m in body) == 1
        assert not pairing_problems(body)
        figures_reach_the_api(stack, thread, jobs)
    finally:
        drop_pg_database(agent_db)


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
