"""A PostgreSQL link that drops, and one that goes silent, under a real API process: every
route answers a declared 503 with ``Retry-After`` (never an undeclared 500), within a bound
set by ``DATABASE_CONNECT_TIMEOUT_S`` and ``DATABASE_TCP_USER_TIMEOUT_S`` (never a hang),
and the API answers 200 again once the link is back.

The database is reached through :mod:`tcp_forwarder` processes: killing one drops its
connections (the kernel ends them); a link gone silent is a veth pair into a network
namespace taken down, so packets are dropped with no reset (root and ``ip netns`` needed,
else that test is skipped)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stack import Stack, create_pg_database, drop_pg_database, free_port, wait_for

from bench.soak import NetnsLink

pytestmark = pytest.mark.usefixtures("stub")

FORWARDER = Path(__file__).resolve().parents[1] / "tcp_forwarder.py"
#: The bounds the stacks below run with (s): a new connection, unacknowledged data.
CONNECT_S, TCP_USER_S = 2, 3
BOUNDED = {
    "DATABASE_CONNECT_TIMEOUT_S": str(CONNECT_S),
    "DATABASE_TCP_USER_TIMEOUT_S": str(TCP_USER_S),
}
#: A request on a dead or silent link answers within this (s): the pooled connection's
#: ping fails after TCP_USER_S, one new connection after CONNECT_S, with room for a loaded
#: host. Without the bounds a silent link holds a request for the kernel's ~15 minutes.
ANSWER_BOUND_S = 4 * (CONNECT_S + TCP_USER_S)


def forwarder(
    listen: tuple[str, int], to: tuple[str, int], prefix: list[str] = ()
) -> subprocess.Popen:
    proc = subprocess.Popen(
        [*prefix, sys.executable, str(FORWARDER), listen[0], str(listen[1]), to[0], str(to[1])],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=10)


def database_name(url: str) -> str:
    return url.rsplit("/", 1)[1]


def turn(n: int) -> list[dict[str, str]]:
    return [{"type": "human", "content": f"hello {n}"}, {"type": "ai", "content": "hi"}]


def assert_unavailable(stack: Stack, session: str) -> float:
    """Each kind of route (a read, a write with a body) answers the database's 503; returns
    the slowest answer's seconds."""
    spec_503 = "did not answer: retry in 5 s"
    slowest = 0.0
    for method, path, body in (
        ("GET", "/sessions", None),
        ("GET", f"/sessions/{session}/messages", None),
        ("POST", f"/sessions/{session}/turns", {"messages": turn(9)}),
    ):
        started = time.monotonic()
        r = stack.http.request(method, path, json=body, timeout=ANSWER_BOUND_S + 60)
        took = time.monotonic() - started
        slowest = max(slowest, took)
        assert r.status_code == 503, (
            method,
            path,
            r.status_code,
            r.text,
            stack.api_log.read_text(errors="replace")[-4000:],  # the traceback of a 500
        )
        assert r.headers["retry-after"] == "5", r.headers
        assert spec_503 in r.json()["detail"], r.text
        assert took < ANSWER_BOUND_S, f"{method} {path} answered after {took:.1f} s"
    return slowest


@pytest.fixture
def database() -> Iterator[str]:
    url = create_pg_database()
    yield url
    drop_pg_database(url)


def test_a_dropped_database_link_gives_a_declared_503_with_retry_after(stacks, database):
    port = free_port()
    link = forwarder(("127.0.0.1", port), ("127.0.0.1", 5432))
    url = f"postgresql://postgres@127.0.0.1:{port}/{database_name(database)}"
    stack = stacks.get("sqlite", DATABASE_URL=url, **BOUNDED)
    try:
        session = f"drop-{uuid.uuid4().hex[:6]}"
        assert stack.post_turn(session, turn(0)).status_code == 200
        declared = stack.http.get("/openapi.json").json()["paths"]
        for path, method in (("/sessions", "get"), ("/sessions/{session_id}/turns", "post")):
            assert "503" in declared[path][method]["responses"], (path, method)
        stop(link)  # its connections end; no new one is accepted
        assert_unavailable(stack, session)
        link = forwarder(("127.0.0.1", port), ("127.0.0.1", 5432))
        wait_for(lambda: stack.http.get("/sessions").status_code == 200, timeout=30)
        assert stack.post_turn(session, turn(1)).status_code == 200
    finally:
        stop(link)
        stacks.discard(stack)


@pytest.fixture
def netns() -> Iterator[NetnsLink]:
    try:
        link = NetnsLink()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"no network namespace here ({exc})"[:200])
    yield link
    link.close()


def test_a_silent_database_fails_a_request_in_seconds_instead_of_hanging_it(
    stacks, database, netns
):
    """Packets to the database dropped, no reset: a pooled connection's ping waits for an
    acknowledgement that never comes (``tcp_user_timeout`` ends it), a new one for a SYN
    answer (``connect_timeout``); the request gets 503, then 200 once the link is back."""
    outer = netns.host.rsplit(".", 1)[0] + ".1"
    relay_port = free_port()
    relay = forwarder((outer, relay_port), ("127.0.0.1", 5432))
    inside = forwarder(("0.0.0.0", 5432), (outer, relay_port), prefix=netns.prefix())
    url = f"postgresql://postgres@{netns.host}:5432/{database_name(database)}"
    stack = stacks.get("sqlite", DATABASE_URL=url, **BOUNDED)
    down = netns.prefix() + ["ip", "link", "set", netns.inner, "down"]
    up = netns.prefix() + ["ip", "link", "set", netns.inner, "up"]
    try:
        session = f"silent-{uuid.uuid4().hex[:6]}"
        assert stack.post_turn(session, turn(0)).status_code == 200
        assert stack.http.get("/sessions").status_code == 200  # pooled connections, warm
        subprocess.run(down, check=True, timeout=30)
        slowest = assert_unavailable(stack, session)
        assert slowest >= TCP_USER_S - 0.5, "answered before any bound could end a wait"
        subprocess.run(up, check=True, timeout=30)
        wait_for(lambda: stack.http.get("/sessions").status_code == 200, timeout=60, interval=1)
        assert stack.post_turn(session, turn(1)).status_code == 200
    finally:
        subprocess.run(up, timeout=30)
        stacks.discard(stack)
        for proc in (inside, relay):
            stop(proc)


def test_a_chat_run_whose_database_drops_answers_503_and_keeps_nothing(stacks, stub, database):
    """A chat turn (a run of the API's own agent) whose database link drops while the model
    answers: the run cannot write its checkpoint. The answer is the database's declared 503
    with ``Retry-After``, not a 502 blaming the chat model, and the thread is as it was once
    the link is back."""
    import threading

    port = free_port()
    link = forwarder(("127.0.0.1", port), ("127.0.0.1", 5432))
    url = f"postgresql://postgres@127.0.0.1:{port}/{database_name(database)}"
    stack = stacks.get("sqlite", DATABASE_URL=url, **BOUNDED)
    session = f"chatdrop-{uuid.uuid4().hex[:6]}"
    answers: list[Any] = []
    try:
        first = stack.http.post(f"/sessions/{session}/messages", json={"content": "first"})
        assert first.status_code == 200, first.text
        before = stack.messages(session)
        stub.state.requests.clear()
        stub.state.gate.clear()  # the model holds its answer
        second = threading.Thread(
            target=lambda: answers.append(
                stack.http.post(
                    f"/sessions/{session}/messages",
                    json={"content": "second"},
                    timeout=ANSWER_BOUND_S + 60,
                )
            )
        )
        second.start()
        wait_for(lambda: stub.state.requests, timeout=30)
        stop(link)
        stub.state.gate.set()
        second.join(timeout=ANSWER_BOUND_S + 90)
        (answer,) = answers
        assert answer.status_code == 503, (answer.status_code, answer.text)
        assert answer.headers["retry-after"] == "5", answer.headers
        link = forwarder(("127.0.0.1", port), ("127.0.0.1", 5432))
        # the run's messages written before the drop (its request, at least) are taken back
        # once the link answers: by the take-back's own retries (every 1-10 s), or first
        # thing by the next write to the thread. A pooled connection the drop broke answers
        # one more 503 (Retry-After) as it goes.
        read = f"/sessions/{session}/messages"
        wait_for(
            lambda: (
                (r := stack.http.get(read)).status_code == 200 and r.json()["messages"] == before
            ),
            timeout=45,
        )
        third = stack.http.post(f"/sessions/{session}/messages", json={"content": "third"})
        assert third.status_code == 200, third.text
        contents = [m.get("content") for m in stack.messages(session)]
        assert "second" not in contents and contents.count("third") == 1, contents
    finally:
        stub.state.gate.set()
        stop(link)
        stacks.discard(stack)


def test_a_reconciler_pass_whose_database_is_down_ends_with_one_warning_line(database, caplog):
    """Celery beat keeps sending ``reconcile`` while PostgreSQL is down: each pass ends with
    one warning line naming the cause (no traceback, no failed task), and the pass lock is
    let go, so the first pass once the link is back runs."""
    import logging

    from stack import REDIS_URL

    import offpath.worker.tasks as tasks
    from offpath.agent.graph import open_thread_writer
    from offpath.config import load_settings

    port = free_port()
    link = forwarder(("127.0.0.1", port), ("127.0.0.1", 5432))
    settings = load_settings(
        database_url=f"postgresql://postgres@127.0.0.1:{port}/{database_name(database)}",
        redis_url=REDIS_URL,
        redis_key_prefix=f"test-recdown-{uuid.uuid4().hex[:8]}",
        database_connect_timeout_s=CONNECT_S,
        database_tcp_user_timeout_s=TCP_USER_S,
    )
    rt = open_thread_writer(settings)
    saved, tasks._runtime = tasks._runtime, (rt, None)  # the worker process's runtime
    try:
        stop(link)
        with caplog.at_level(logging.WARNING, logger="offpath"):
            assert tasks.reconcile.run() == {}
        ended = [r for r in caplog.records if "reconciler: pass ended" in r.getMessage()]
        assert len(ended) == 1 and ended[0].exc_info is None, caplog.text
        assert not any(r.exc_info for r in caplog.records), caplog.text
        link = forwarder(("127.0.0.1", port), ("127.0.0.1", 5432))
        # a pooled connection the drop broke may end one more pass as it goes
        wait_for(
            lambda: (
                tasks.reconcile.run() is not None
                and rt.leases.store.get(f"{settings.redis_key_prefix}:reconciler:last")
            ),
            timeout=30,
        )
    finally:
        tasks._runtime = saved
        rt.close()
        stop(link)
