"""DESIGN.md invariant 19 with real processes: a middleware built with settings given in code
(another queue and Redis key prefix than the defaults), in a test process whose environment
names neither, sends its jobs to the worker that consumes the given queue.

The worker is a real Celery process started with its own environment (``tests/stack.py``);
the agent is a real ``create_agent`` run with a scripted model, over its threshold, in this
process. The middleware is given the settings only: no client, no publisher, so it opens
them itself, as a team's app does.
"""

from __future__ import annotations

import os
import uuid

from agent_replay import TranscriptModel
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from stack import SETTLED, wait_for

from offpath import OffPathCompaction
from offpath.compaction.settings import Settings
from offpath.stores.checkpoints import open_checkpoints_url

ENV = {
    "SUMMARIZATION_THRESHOLD_CHARS": "20000",
    "SUMMARIZATION_KEEP_CHARS": "6000",
    "JOB_LEASE_S": "3",
    "RECONCILE_INTERVAL_S": "2",
}


@tool
def get_logs(service: str, page: int) -> str:
    """A page of the service's logs."""
    lines = (f"{page}:{i} GET /cart 200 {i % 97} ms pod-{i % 7}" for i in range(2_000))
    return "\n".join(lines)[:3_500]


def test_a_job_of_a_middleware_given_settings_reaches_the_worker_on_its_queue(stacks, tmp_path):
    stack = stacks.get("sqlite", **ENV)
    # the test process's environment names no queue, prefix or broker (conftest drops them)
    assert not {"CELERY_QUEUE", "REDIS_KEY_PREFIX", "REDIS_URL"} & set(os.environ)
    settings = stack.settings()
    defaults = Settings.model_fields
    assert settings.celery_queue != defaults["celery_queue"].default
    assert settings.redis_key_prefix != defaults["redis_key_prefix"].default
    assert settings.redis_url != defaults["redis_url"].default

    store = f"sqlite:///{tmp_path / 'agent.db'}"
    middleware = OffPathCompaction(settings, checkpointer_url=store)
    replies = [
        AIMessage(
            "",
            tool_calls=[
                {"id": f"c-{k}", "name": "get_logs", "args": {"service": "cart", "page": k}}
            ],
            id=f"a-{k}",
        )
        for k in range(12)
    ]
    model = TranscriptModel(replies=[*replies, AIMessage("done", id="a-end")], delay_s=0.2)
    session = f"given-{uuid.uuid4().hex[:8]}"
    with open_checkpoints_url(store, settings) as checkpoints:
        agent = create_agent(
            model, [get_logs], middleware=[middleware], checkpointer=checkpoints.saver
        )
        config = {"configurable": {"thread_id": session}}
        agent.invoke({"messages": [HumanMessage("why is the cart slow?", id="h-0")]}, config)

    # the job the run queued was taken by the stack's worker, which consumes only the given
    # queue: it ended (prepared, or applied in the run) and the worker's log names it
    def done() -> list[dict]:
        return [j for j in stack.jobs(session) if j["status"] in SETTLED]

    jobs = wait_for(done, timeout=90)
    assert all(j["status"] != "failed" for j in jobs), jobs
    job_id = jobs[0]["job_id"]
    log = stack.worker_log.read_text(errors="replace")
    assert f"job {job_id} for session {session!r}" in log, log[-3000:]
    # its lease was taken under the given prefix (the worker's own, from its environment)
    assert middleware.client.leases.prefix == stack.env["REDIS_KEY_PREFIX"]
