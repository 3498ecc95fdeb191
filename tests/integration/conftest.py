"""Fixtures for tests with real processes: the stub LLM (real HTTP), and stacks of a
Celery worker plus the API on SQLite or PostgreSQL, cached by configuration."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import pytest
from stack import Stack
from stub_llm import StubServer

BACKENDS = ["sqlite", "postgres"]
MAX_ALIVE = 2


@pytest.fixture(scope="session")
def stub() -> Iterator[StubServer]:
    server = StubServer().start()
    yield server
    server.shutdown()


@pytest.fixture(autouse=True)
def _reset_stub(stub: StubServer) -> None:
    with stub.state.lock:
        stub.state.mode, stub.state.times, stub.state.delay_s = "ok", None, 0.0
        stub.state.requests.clear()


class Stacks:
    """Starts stacks on demand and keeps the last few alive (tests are grouped by config)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory, stub: StubServer) -> None:
        self.tmp = tmp_path_factory.mktemp("stacks")
        self.stub = stub
        self.alive: OrderedDict[tuple, Stack] = OrderedDict()

    def get(self, backend: str, llm: bool = True, **env: str) -> Stack:
        if llm:
            env = {"OPENAI_BASE_URL": self.stub.base_url, **env}
        key = (backend, tuple(sorted(env.items())))
        if key in self.alive:
            self.alive.move_to_end(key)
            return self.alive[key]
        while len(self.alive) >= MAX_ALIVE:
            _, old = self.alive.popitem(last=False)
            old.stop()
        stack = Stack(backend, self.tmp, env)
        self.alive[key] = stack
        return stack

    def close(self) -> None:
        for stack in self.alive.values():
            stack.stop()
        self.alive.clear()


@pytest.fixture(scope="session")
def stacks(tmp_path_factory: pytest.TempPathFactory, stub: StubServer) -> Iterator[Stacks]:
    s = Stacks(tmp_path_factory, stub)
    yield s
    s.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param
