"""DESIGN.md invariant 19, one source of settings: a part given a ``Settings`` uses it for all
it does (publishing, leases, job rows, the archive, the recall tool, the session's row) and
never reads the environment's settings.

Here the environment's settings are made invalid once the given settings exist, and
:func:`get_settings`' cache is cleared: any call of it on these paths would raise (and be
counted by its cache's misses), as would any other read of the environment through
pydantic-settings. The middleware in a real ``create_agent`` run and the API's post-turn hook
(the app made by ``create_app(settings)``) then queue their job on the given broker's given
queue, under the given lease prefix, in the given usage database: read back from real Redis
(database 13) and SQLite. The worker, a process configured by its environment, is followed in
``tests/integration/test_settings_source.py``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from agent_replay import TranscriptModel
from kombu import Connection
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from stack import REDIS_URL, forget_broker_queue

from offpath import OffPathCompaction
from offpath.compaction.settings import Settings
from offpath.config import EnvironmentSettings, get_settings, load_settings
from offpath.stores.db.engine import make_engine, migrate
from offpath.stores.db.job_queries import job_row

THRESHOLD, KEEP = 20_000, 6_000


@pytest.fixture
def given(tmp_path) -> Iterator[Settings]:
    """Settings given in code (their own queue, key prefix and data dir), then an environment
    whose settings cannot load (the keep window over the threshold)."""
    name = f"given-{uuid.uuid4().hex[:8]}"
    settings = load_settings(
        redis_url=REDIS_URL,
        celery_queue=name,
        redis_key_prefix=name,
        data_dir=str(tmp_path / "data"),
        summarization_threshold_chars=THRESHOLD,
        summarization_keep_chars=KEEP,
        auth_disabled=True,
        allowed_hosts="*",
    )
    mp = pytest.MonkeyPatch()
    mp.setenv("SUMMARIZATION_THRESHOLD_CHARS", "1000")
    mp.setenv("SUMMARIZATION_KEEP_CHARS", "5000")
    mp.setenv("CELERY_QUEUE", "from-the-environment")
    get_settings.cache_clear()
    try:
        yield settings
    finally:
        mp.undo()
        get_settings.cache_clear()
        forget_broker_queue({"REDIS_URL": REDIS_URL, "CELERY_QUEUE": name})


def environment_unread() -> None:
    with pytest.raises(Exception, match="SUMMARIZATION_KEEP_CHARS"):
        EnvironmentSettings()  # the environment's settings really are unloadable here
    info = get_settings.cache_info()
    assert info.hits + info.misses == 0, "get_settings() was called on a path given settings"


def next_job(settings: Settings, timeout: float = 30) -> dict:
    """The next ``compact_session`` message on the given broker's given queue (consumed)."""
    with Connection(settings.broker_url) as conn:
        queue = conn.SimpleQueue(settings.celery_queue, no_ack=True)
        try:
            message = queue.get(timeout=timeout)
            return {"headers": message.headers, "body": message.decode()}
        finally:
            queue.close()


def log_lines(k: int, chars: int = 3_500) -> str:
    body = "\n".join(f"{k}:{i} GET /cart 200 {i % 97} ms pod-{i % 7}" for i in range(2_000))
    return body[:chars]


@tool
def get_logs(service: str, page: int) -> str:
    """A page of the service's logs."""
    return log_lines(page)


def calls(steps: int) -> list[AIMessage]:
    """The model's replies of a run: a ``get_logs`` call a step, then an answer."""
    out = [
        AIMessage(
            "",
            tool_calls=[
                {"id": f"c-{k}", "name": "get_logs", "args": {"service": "cart", "page": k}}
            ],
            id=f"a-{k}",
        )
        for k in range(steps)
    ]
    return [*out, AIMessage("looked into it", id="a-end")]


def history(steps: int) -> list:
    """A finished run's messages, for an imported turn."""
    out: list = [HumanMessage("why is checkout-api slow?", id="h-0")]
    for reply in calls(steps)[:-1]:
        call = reply.tool_calls[0]
        out += [
            reply,
            ToolMessage(
                log_lines(call["args"]["page"]), tool_call_id=call["id"], id=f"t-{call['id']}"
            ),
        ]
    return [*out, AIMessage("looked into it", id="a-end")]


def test_the_middleware_given_settings_publishes_leases_and_records_with_them(given):
    settings = given
    migrate(settings)  # as the worker would; with the given URL, not the environment's
    middleware = OffPathCompaction(settings)
    model = TranscriptModel(replies=calls(7))  # 7 results of 3,500 chars: past the 16,000
    agent = create_agent(model, [get_logs], middleware=[middleware], checkpointer=InMemorySaver())
    session = f"own-{uuid.uuid4().hex[:8]}"
    request = HumanMessage("why is checkout-api slow?", id="h-0")
    agent.invoke({"messages": [request]}, {"configurable": {"thread_id": session}})

    job = next_job(settings)
    assert job["body"][0] == [session]
    job_id = job["headers"]["id"]
    # the lease under the given prefix, the row in the given database, both naming that job
    claim = middleware.client.leases.holder(session)
    assert claim is not None and claim.job_id == job_id
    assert middleware.client.leases.prefix == settings.redis_key_prefix
    engine = make_engine(settings)
    try:
        row = job_row(engine, job_id)
        assert row is not None and row["session_id"] == session
    finally:
        engine.dispose()
    # the recall tool reads the given database's archive (nothing archived under this word)
    config = {"configurable": {"thread_id": session}}
    answer = middleware.tools[0].invoke({"query": "no-such-word"}, config)
    assert "nothing archived" in answer, answer
    environment_unread()


def test_the_api_given_settings_queues_the_post_turn_job_on_them(given):
    from fastapi.testclient import TestClient

    from offpath.api.app import create_app

    settings = given
    app = create_app(settings)
    session = f"api-{uuid.uuid4().hex[:8]}"
    turn = [
        {"type": m.type, "content": m.content, "id": m.id}
        | ({"tool_calls": m.tool_calls} if getattr(m, "tool_calls", None) else {})
        | ({"tool_call_id": m.tool_call_id} if isinstance(m, ToolMessage) else {})
        for m in history(7)
    ]
    with TestClient(app) as http:
        r = http.post(f"/sessions/{session}/turns", json={"messages": turn})
        assert r.status_code == 200, r.text
        job = next_job(settings)
        assert job["body"][0] == [session]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            jobs = http.get(f"/sessions/{session}/compactions").json()["jobs"]
            if jobs:
                break
            time.sleep(0.05)
        assert [j["job_id"] for j in jobs] == [job["headers"]["id"]]
        ready = http.get("/readyz").json()
        assert settings.celery_queue in str(ready["queues"])  # the given queue is the one checked
    environment_unread()
