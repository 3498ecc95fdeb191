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
        assert r.status_code == 503, (method, path, r.status_code, r.text)
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
