"""An operator's second day (issue 35), the rules as units: a store that cannot be reached is
one line, then a count (item 1); a team's agent makes offpath's tables on first use, in a
real SQLite file and on a real PostgreSQL database (item 1)."""

from __future__ import annotations

import logging

import psycopg
import pytest
import sqlalchemy as sa
from stack import create_pg_database, drop_pg_database

from offpath.config import load_settings
from offpath.coordination.outages import (
    Outages,
    TablesUnavailable,
    cause,
    is_outage,
    missing_tables,
    where,
)
from offpath.coordination.runtime import Client


def _db_error(url: str) -> sa.exc.OperationalError:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        return exc
    finally:
        engine.dispose()
    raise AssertionError("the database answered")


def test_an_outage_is_one_line_then_a_count_then_one_line_when_it_ends(caplog):
    outages = Outages(repeat_s=3600)
    exc = ConnectionError("Connection refused")
    with caplog.at_level(logging.INFO, logger="offpath.outages"):
        for _ in range(50):
            outages.failed("lease store", "redis://127.0.0.1:1/0", exc, "no compaction")
        assert outages.down("lease store", "redis://127.0.0.1:1/0") == 50
        outages.recovered("lease store", "redis://127.0.0.1:1/0")
        outages.recovered("lease store", "redis://127.0.0.1:1/0")  # nothing open: silent
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "lease store at redis://127.0.0.1:1/0 cannot be reached" in lines[0]
    assert "ConnectionError: Connection refused" in lines[0] and "no compaction" in lines[0]
    assert "answers again (50 failure(s)" in lines[1]
    assert outages.down("lease store", "redis://127.0.0.1:1/0") == 0


def test_a_long_outage_says_its_count_again_at_most_every_repeat_period(caplog):
    outages = Outages(repeat_s=0.0)  # every failure is past the period
    with caplog.at_level(logging.WARNING, logger="offpath.outages"):
        for _ in range(3):
            outages.failed("broker", "amqp://h//", TimeoutError("timed out"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and "cannot be reached (TimeoutError: timed out)" in lines[0]
    assert "still cannot be reached: 2 failures since" in lines[1]
    assert "still cannot be reached: 3 failures since" in lines[2]


def test_the_cause_is_the_drivers_first_line_without_the_statement():
    exc = _db_error("postgresql://postgres@127.0.0.1:5432/offpath_test_no_such_database")
    text = cause(exc)
    assert text.startswith("OperationalError: ") and "does not exist" in text
    assert "\n" not in text and "sqlalche.me" not in text
    assert is_outage(exc) and not is_outage(ValueError("a bug"))
    assert not missing_tables(exc)


def test_a_missing_table_says_run_offpath_migrate(caplog, tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(sa.exc.OperationalError) as info, engine.connect() as conn:
        conn.execute(sa.text("SELECT * FROM compaction_jobs"))
    engine.dispose()
    assert missing_tables(info.value)
    with caplog.at_level(logging.WARNING, logger="offpath.outages"):
        Outages().failed("usage database", "x.db", info.value)
    assert "run `offpath migrate`" in caplog.text


def test_where_names_each_store_without_its_password(tmp_path):
    s = load_settings(
        database_url="postgresql://u:secret@db:5432/offpath",
        redis_url="redis://:pw@cache:6379/0",
        celery_broker_url="amqp://guest:hidden@mq:5672//",
    )
    assert where("usage database", s) == "postgresql://u:**@db:5432/offpath"
    assert where("lease store", s) == "redis://:**@cache:6379/0"
    assert where("broker", s) == "amqp://guest:**@mq:5672//"
    embedded = load_settings(data_dir=str(tmp_path), lock_backend="database")
    assert where("lease store", embedded) == str(tmp_path / "usage.db")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_clients_first_use_of_the_usage_database_makes_the_tables(backend, tmp_path):
    url = create_pg_database("offpath_test_fresh") if backend == "postgres" else ""
    client = Client.open(
        load_settings(database_url=url, data_dir=str(tmp_path), lock_backend="database")
    )
    try:
        with client.engine.connect() as conn:  # made before its first connection is used
            tables = set(sa.inspect(conn).get_table_names())
        assert {"compaction_jobs", "usage_events", "archive", "sessions"} <= tables
    finally:
        client.close()
        if url:
            drop_pg_database(url)


def test_tables_that_cannot_be_made_raise_a_named_error_and_are_not_retried_at_once(tmp_path):
    url = "postgresql://postgres@127.0.0.1:5432/offpath_test_never_created"
    client = Client.open(load_settings(database_url=url, lock_backend="database"))
    with pytest.raises(TablesUnavailable) as first:
        client.ensure_tables()
    assert "does not exist" in str(first.value) and is_outage(first.value)
    with pytest.raises(TablesUnavailable) as again:  # within TABLES_RETRY_S: not tried again
        client.ensure_tables()
    assert str(again.value) == str(first.value) and again.value.__cause__ is None
    client.close()
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres") as conn:
        assert not conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = 'offpath_test_never_created'"
        ).fetchone()


def test_a_run_that_raises_still_leaves_its_threads_latest_size_in_the_sessions_list(
    tmp_path, monkeypatch
):
    """Issue 35, item 6: a team's agent whose run raised (a tool's error) was listed at its
    first call's size ("1 message, 85 chars") as no run's end noted it; the size a later call
    saw is written once the note period ends."""
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langgraph.checkpoint.memory import InMemorySaver
    from stack import wait_for

    from offpath.agent.middleware import sessions
    from offpath.agent.middleware.hooks import OffPathCompaction
    from offpath.stores.tenants import SESSIONS

    monkeypatch.setattr(sessions, "NOTE_EVERY_S", 0.5)

    class Model(GenericFakeChatModel):
        def bind_tools(self, tools, **kwargs):
            return self

    def logs(service: str) -> str:
        """Read a service's logs."""
        return "14:02:11 checkout-api GET /cart 200 35 ms\n" * 100

    def restart(service: str) -> str:
        """Restart a service."""
        raise RuntimeError("not allowed")

    call = lambda i, name: AIMessage(  # noqa: E731
        content="", tool_calls=[{"id": f"c{i}", "name": name, "args": {"service": "checkout"}}]
    )
    settings = load_settings(data_dir=str(tmp_path), lock_backend="database")
    middleware = OffPathCompaction(settings)
    agent = create_agent(
        Model(messages=iter([call(1, "logs"), call(2, "restart")])),
        [logs, restart],
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "raised"}}
    with pytest.raises(RuntimeError, match="not allowed"):
        agent.invoke({"messages": [{"role": "user", "content": "why is checkout slow?"}]}, config)

    def listed() -> tuple[int, int] | None:
        with middleware.client.engine.connect() as conn:
            row = conn.execute(
                sa.select(SESSIONS.c.messages, SESSIONS.c.chars).where(
                    SESSIONS.c.session_id == "raised"
                )
            ).first()
        return tuple(row) if row and row[0] == 3 else None

    messages, chars = wait_for(listed, timeout=60)  # the second call's: request, call, result
    assert chars > len(logs("checkout"))


def test_a_size_seen_earlier_never_overwrites_a_later_one_in_the_sessions_list(tmp_path):
    """The middleware's two writer threads may run two notes of one thread at once, and the
    one seen first may end last (the first opens the client and the tables): the row keeps
    the size seen last."""
    from offpath.agent.middleware.hooks import OffPathCompaction
    from offpath.stores.tenants import SESSIONS

    middleware = OffPathCompaction(load_settings(data_dir=str(tmp_path), lock_backend="database"))
    middleware.sessions._note("ordered", 3, 300, seen_at=2.0)
    middleware.sessions._note("ordered", 1, 85, seen_at=1.0)
    with middleware.client.engine.connect() as conn:
        row = conn.execute(
            sa.select(SESSIONS.c.messages, SESSIONS.c.chars).where(
                SESSIONS.c.session_id == "ordered"
            )
        ).one()
    assert tuple(row) == (3, 300)


def test_beat_check_reads_one_key_and_opens_no_agent_worker_or_checkpointer(tmp_path):
    """Issue 35, item 6: ``offpath beat --check`` (the Compose health check of ``beat``, 5 s)
    opened a whole runtime (the agent graph, LangGraph, the checkpointer) to read one key;
    it now reads the reconciler's key alone. Checked by what the process imports (its time
    is a benchmark's business) and by its answers."""
    import os
    import subprocess
    import sys
    import time
    import uuid

    import redis
    from stack import REDIS_URL

    from offpath.stores.leases.key_stores import reconciler_key

    prefix = f"test-beat-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "REDIS_URL": REDIS_URL, "REDIS_KEY_PREFIX": prefix}
    cmd = [sys.executable, "-X", "importtime", "-m", "offpath.cli.main", "beat", "--check"]

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)

    never = check()
    assert never.returncode == 1 and "has not run lately" in never.stdout + never.stderr
    imported = {line.split("|")[-1].strip() for line in never.stderr.splitlines() if "|" in line}
    opened = (  # what opening a runtime brought: the agent graph, the worker, a checkpointer
        "offpath.agent",
        "offpath.worker",
        "langchain.agents",
        "langgraph.checkpoint.postgres",
        "langgraph.checkpoint.sqlite",
        "celery",
    )
    heavy = {m for m in imported if m.startswith(opened)}
    assert not heavy, sorted(heavy)[:10]
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.set(reconciler_key(prefix), f"{time.time():.3f}", ex=60)
        ran = check()
        assert ran.returncode == 0 and "reconciler: last pass" in ran.stdout, ran.stdout
    finally:
        client.delete(reconciler_key(prefix))
        client.close()


def test_flowers_no_worker_warnings_become_one_info_line_and_other_warnings_stay():
    """Issue 35, item 6: Flower started before any worker warned once per inspect method;
    ``offpath flower`` says it once, at INFO. Flower's own logger, its own message."""
    from offpath.cli.flower_run import NO_ANSWER, NoWorkerYet

    logger = logging.getLogger("flower.inspector")
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler, quiet = Keep(), NoWorkerYet()
    logger.addHandler(handler)
    logger.addFilter(quiet)
    try:
        for method in ("active_queues", "conf", "registered", "stats"):
            logger.warning(NO_ANSWER, method)
        logger.warning("Inspect method %s failed: %s", "stats", "connection refused")
    finally:
        logger.removeFilter(quiet)
        logger.removeHandler(handler)
    assert [(r.levelname, r.getMessage()[:26]) for r in seen] == [
        ("INFO", "no worker answered Flower'"),
        ("WARNING", "Inspect method stats faile"),
    ]


def test_a_quoted_request_is_not_called_the_turn_in_progress_and_old_summaries_still_read():
    """Issue 35, item 6: a summary prepared while turn 6 ran and applied after it quoted turn
    5's request (the cut fell inside turn 5) as "the turn in progress", beside a frontier
    that says turn 5 is done and turn 6 under way. The quote's heading says what it is; a
    summary written with the old heading still gives its request and body back."""
    from langchain_core.messages import HumanMessage

    from offpath.compaction.summary import (
        build_summary_message,
        summary_body,
        summary_request,
    )

    built = build_summary_message(
        message_id="m1",
        summary_text="**Investigating:** What should we do now?",
        replaced_ids=["m1"],
        replaced_chars=10,
        summarizer="offline",
        compactions=1,
        request="Compare the replicas.",
    )
    assert "in progress" not in built.content
    assert "**Request of the turn the kept messages start in (verbatim):**" in built.content
    assert summary_request(built) == "Compare the replicas."
    assert summary_body(built).endswith("What should we do now?")
    old = HumanMessage(
        built.content.replace("the turn the kept messages start in", "the turn in progress"),
        additional_kwargs=built.additional_kwargs,
    )
    assert summary_request(old) == "Compare the replicas."
    assert summary_body(old) == summary_body(built)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres@127.0.0.1:5432/offpath_test_never_created",
        "sqlite:////nonexistent-dir/agent-checkpoints.db",
    ],
)
def test_a_checkpointer_url_the_worker_cannot_read_is_said_once_as_the_agent_is_built(
    url, tmp_path, caplog
):
    """Issue 35, item 1: the checkpointer a team's agent names for the worker
    (``checkpointer_url``) is checked as the agent is built: one line naming it."""
    from stack import wait_for

    from offpath.agent.middleware.hooks import OffPathCompaction
    from offpath.coordination.outages import OUTAGES

    settings = load_settings(data_dir=str(tmp_path), lock_backend="database")
    with caplog.at_level(logging.WARNING, logger="offpath.outages"):
        OffPathCompaction(settings, checkpointer_url=url)
        wait_for(lambda: "checkpointer at" in caplog.text, timeout=30)
    (line,) = [r.getMessage() for r in caplog.records if "checkpointer at" in r.getMessage()]
    assert f"checkpointer at {url} cannot be reached" in line and "worker" in line
    OUTAGES.recovered("checkpointer", url)
