"""Event streams with limits (issue 34, items 3 and 4): ``GET /sessions/{id}/events`` is
capped per key and per process (429 with ``Retry-After``), read by one poller for every open
stream, and ends when its key is revoked or its session deleted, never carrying the events
of a later tenant of the id. On a real API process (SQLite and PostgreSQL), over HTTP."""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from stack import wait_for

from offpath.api.streams import STREAMS_MAX, STREAMS_PER_KEY

pytestmark = pytest.mark.usefixtures("stub")


def sid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Reader:
    """One open stream, read on a thread from a plain socket (closed at once by
    :meth:`close`): its status, headers and body if refused, its event lines, and whether the
    server ended it."""

    def __init__(self, port: int, key: str, session: str) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.body = b""
        self.opened = threading.Event()
        self.ended = threading.Event()
        self._stop = threading.Event()
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=0.5)
        request = (
            f"GET /sessions/{session}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {key}\r\nConnection: close\r\n\r\n"
        )
        self._sock.sendall(request.encode())
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        assert self.opened.wait(30), "the stream did not answer"

    def json(self) -> Any:
        return json.loads(self.body)

    def _recv(self) -> bytes | None:
        """The next bytes (b"": the server closed), or None once told to stop."""
        while not self._stop.is_set():
            try:
                return self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return b""
        return None

    def _read(self) -> None:
        raw = b""
        try:
            while b"\r\n\r\n" not in raw:
                got = self._recv()
                if not got:
                    return
                raw += got
            head, _, rest = raw.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            self.status = int(lines[0].split()[1])
            self.headers = {
                k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])
            }
            if self.status != 200:
                while len(rest) < int(self.headers.get("content-length", "0")):
                    got = self._recv()
                    if not got:
                        break
                    rest += got
                self.body = rest
                return
            self.opened.set()
            buffer = rest.decode()
            while True:
                *complete, buffer = buffer.split("\n")
                for line in complete:
                    if line.startswith(("data: ", "retry: ", ": keep-alive")):
                        self.lines.put(line)
                got = self._recv()
                if not got:
                    return
                buffer += got.decode()
        finally:
            if not self._stop.is_set():
                self.ended.set()
            self.opened.set()
            self.lines.put(None)

    def events(self, timeout: float, until: str | None = None) -> list[dict[str, Any]]:
        """The events' data read within ``timeout`` seconds, until the stream ends or (given
        ``until``) an event of that status came."""
        out, deadline = [], time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            if line.startswith("data: "):
                out.append(json.loads(line.removeprefix("data: ")))
                if until is not None and out[-1]["update"]["status"] == until:
                    break
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._sock.close()


@contextmanager
def streams(stack, key: str, session: str, n: int) -> Iterator[list[Reader]]:
    readers = [Reader(stack.port, key, session) for _ in range(n)]
    try:
        yield readers
    finally:
        for r in readers:
            r.close()


def a_session(stack, key: str) -> str:
    session = sid("events")
    with httpx.Client(base_url=stack.url, headers=headers(key), timeout=30) as http:
        r = http.post(
            f"/sessions/{session}/turns", json={"messages": [{"type": "human", "content": "hi"}]}
        )
        assert r.status_code == 200, r.text
    return session


def scraped(stack, name: str) -> float:
    for line in stack.http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not on /metrics")


def held_open(stack, key: str, session: str) -> tuple[int, dict[str, str], socket.socket]:
    """A stream opened and left open (its head read, nothing more): status, headers, socket."""
    sock = socket.create_connection(("127.0.0.1", stack.port), timeout=30)
    sock.sendall(
        f"GET /sessions/{session}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\n\r\n".encode()
    )
    raw = b""
    while b"\r\n\r\n" not in raw:
        got = sock.recv(4096)
        assert got, raw
        raw += got
    lines = raw.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    found = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), found, sock


def test_streams_are_capped_per_key_and_per_process(stacks):
    """Issue 34, item 3: one key held 600 idle streams and another tenant's GET /messages went
    from 169 ms to 2,657 ms median; nothing capped them. Past 8 streams of one key, or 256 of
    the process, a stream is refused with 429 and Retry-After; one that closes, its client
    gone, frees its place."""
    stack = stacks.get("sqlite")
    keys = [
        stack.create_key(f"watcher-{i}", admin=True)
        for i in range(STREAMS_MAX // STREAMS_PER_KEY + 1)
    ]
    session = a_session(stack, stack.key)
    held: list[socket.socket] = []
    try:
        for key in keys[:-1]:
            for _ in range(STREAMS_PER_KEY):
                status, _, sock = held_open(stack, key, session)
                held.append(sock)
                assert status == 200, (len(held), status)
            status, found, sock = held_open(stack, key, session)
            sock.close()
            assert status == 429 and found["retry-after"] == "5", (len(held), status)
        assert scraped(stack, "offpath_api_event_streams") == STREAMS_MAX
        status, found, sock = held_open(stack, keys[-1], session)  # a key with none open
        sock.close()
        assert status == 429 and found["retry-after"] == "5", status
        with httpx.Client(base_url=stack.url, headers=headers(keys[-1]), timeout=30) as http:
            r = http.get(f"/sessions/{session}/events")
        assert "the most it serves" in r.json()["detail"]
        held.pop().close()
        wait_for(lambda: scraped(stack, "offpath_api_event_streams") == STREAMS_MAX - 1, timeout=30)
        status, _, sock = held_open(stack, keys[-1], session)
        held.append(sock)
        assert status == 200
    finally:
        for sock in held:
            sock.close()
    assert wait_for(lambda: scraped(stack, "offpath_api_event_streams") == 0, timeout=30)


def test_one_poller_reads_the_job_rows_for_every_stream(stacks, stub):
    """Each open stream polled the job rows every 0.5 s on the shared thread pool; now one
    poller reads them for all, one query a tick however many streams are open, and each
    stream still hears every change of its session once."""
    stack = stacks.get("sqlite")
    session = a_session(stack, stack.key)
    with streams(stack, stack.key, session, 6) as readers:
        before, started = scraped(stack, "offpath_api_event_stream_polls_total"), time.monotonic()
        time.sleep(3)
        polls = scraped(stack, "offpath_api_event_stream_polls_total") - before
        ticks = (time.monotonic() - started) / 0.5
        assert 0 < polls <= ticks + 2, (polls, ticks)  # not 6 streams x ticks
        r = stack.http.post(f"/sessions/{session}/turns", json={"messages": long_turn()})
        assert r.status_code == 200, r.text
        job = stack.http.post(f"/sessions/{session}/compact")
        assert job.status_code == 202, job.text
        job_id = job.json()["job_id"]
        for reader in readers:
            heard = [
                e["update"]["status"]
                for e in reader.events(60, until="completed")
                if e["update"]["compactionId"] == job_id
            ]
            assert heard == ["in_progress", "completed"], heard


def long_turn() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(10):
        out += [
            {"type": "human", "content": f"step {i}", "id": f"h{i}"},
            {
                "type": "ai",
                "content": "",
                "id": f"a{i}",
                "tool_calls": [{"id": f"t{i}", "name": "get_logs", "args": {"n": i}}],
            },
            {"type": "tool", "tool_call_id": f"t{i}", "content": f"line {i} " * 600, "id": f"r{i}"},
        ]
    return out


def test_a_stream_ends_when_its_key_is_revoked(stacks, backend):
    """Issue 34, item 3: a key revoked while its stream was open kept receiving the session's
    job events; ownership was checked only when the stream opened. The key is checked again
    at each event and every few seconds: the stream ends."""
    from offpath.stores.db.engine import make_engine
    from offpath.stores.tenants import revoke_key

    stack = stacks.get(backend)
    key = stack.create_key("revoked")
    session = a_session(stack, key)
    with streams(stack, key, session, 1) as (reader,):
        assert reader.status == 200
        engine = make_engine(stack.settings())
        try:
            revoke_key(engine, key)
        finally:
            engine.dispose()
        assert reader.ended.wait(30), "the stream outlived its key"


def test_a_stream_on_a_deleted_session_never_carries_the_next_tenants_events(stacks, backend):
    """Issue 34, item 3: a stream on a deleted session carried the events of the next tenant
    to claim the id. Deleted, the session's stream ends; the id claimed again by another
    tenant, a stream opened before never hears its jobs."""
    stack = stacks.get(backend)
    alice, bob = stack.create_key("alice"), stack.create_key("bob")
    session = a_session(stack, alice)
    with streams(stack, alice, session, 1) as (reader,):
        assert reader.status == 200
        with httpx.Client(base_url=stack.url, headers=headers(alice), timeout=30) as http:
            assert http.delete(f"/sessions/{session}").status_code == 204
        with httpx.Client(base_url=stack.url, headers=headers(bob), timeout=60) as http:
            r = http.post(f"/sessions/{session}/turns", json={"messages": long_turn()})
            assert r.status_code == 200, r.text
            assert http.post(f"/sessions/{session}/compact").status_code == 202
        assert reader.ended.wait(30), "the stream outlived its session"
        assert reader.events(1) == [], "a later tenant's events reached the stream"
