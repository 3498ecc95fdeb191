"""Shared fixtures. Tests import helpers from this folder (``shared``, ``stack``,
``stub_llm``). For tests with real processes: the stub LLM (real HTTP) and stacks
of a Celery worker plus the API on SQLite or PostgreSQL, cached by configuration."""

import os
import sys
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import pytest

from offpath.compaction.settings import Settings

# The tests set every setting they need: a developer's .env or exported settings must not
# leak into them (nor into the processes they start, which inherit this environment).
os.environ["OFFPATH_ENV_FILE"] = ""
for _name in [k for k in os.environ if k.lower() in Settings.model_fields]:
    del os.environ[_name]

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stack import REDIS_URL, Stack  # noqa: E402
from stub_llm import StubServer  # noqa: E402

BACKENDS = ["sqlite", "postgres"]
MAX_ALIVE = 2


@pytest.fixture(scope="session")
def stub_server() -> Iterator[StubServer]:
    server = StubServer().start()
    yield server
    server.shutdown()


@pytest.fixture
def stub(stub_server: StubServer) -> Iterator[StubServer]:
    """The stub LLM, reset to answer at once, with no requests recorded; reset again after the
    test, so a mode it set never reaches a later test's stack on this worker process."""
    stub_server.state.reset()
    yield stub_server
    stub_server.state.reset(requests=False)


class Stacks:
    """Starts stacks on demand and keeps the last few alive (tests are grouped by config)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory, stub: StubServer) -> None:
        self.tmp = tmp_path_factory.mktemp("stacks")
        self.stub = stub
        self.alive: OrderedDict[tuple, Stack] = OrderedDict()

    def get(self, backend: str, llm: bool = True, beat: bool = True, **env: str) -> Stack:
        """A stack of this configuration; ``beat=False``: no reconciler runs."""
        if llm:
            env = {"OPENAI_BASE_URL": self.stub.base_url, **env}
        key = (backend, beat, tuple(sorted(env.items())))
        if key in self.alive:
            self.alive.move_to_end(key)
            return self.alive[key]
        while len(self.alive) >= MAX_ALIVE:
            _, old = self.alive.popitem(last=False)
            old.stop()
        stack = Stack(backend, self.tmp, env, beat=beat)
        self.alive[key] = stack
        return stack

    def discard(self, stack: Stack) -> None:
        """Stop a stack whose services a test broke (a private Redis it killed)."""
        stack.stop()
        for key in [k for k, v in self.alive.items() if v is stack]:
            del self.alive[key]

    def close(self) -> None:
        for stack in self.alive.values():
            stack.stop()
        self.alive.clear()


@pytest.fixture(scope="session")
def stacks(tmp_path_factory: pytest.TempPathFactory, stub_server: StubServer) -> Iterator[Stacks]:
    s = Stacks(tmp_path_factory, stub_server)
    yield s
    s.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def fault_n() -> int:
    """How many times each fault is injected: once in CI, more with FAULT_N=20 (make bench: 3)."""
    return int(os.environ.get("FAULT_N", "1"))


#: Seconds a binding no running process names must stay before the session reports it.
LEFTOVER_GRACE_S = 3.0


@pytest.fixture(scope="session", autouse=True)
def no_broker_bindings_left_behind() -> Iterator[None]:
    """Issue 8, item 12: the session leaves no kombu binding naming a test queue or worker,
    nor unacknowledged messages of a test queue, in the tests' Redis database. Leftovers
    of earlier runs are removed first; at the end only what appeared during this session
    is checked (and removed)."""
    import redis
    from leftovers import REPLY_QUEUE, abandoned, everything, forget

    try:
        forget(REDIS_URL, abandoned(REDIS_URL))
        before = {(b.key, b.member) for b in everything(REDIS_URL)}  # a live session's too
    except redis.RedisError:  # no Redis: the tests that need it say so themselves
        yield
        return
    yield
    left = [b for b in abandoned(REDIS_URL) if (b.key, b.member) not in before]
    if left:
        # another xdist worker may be stopping a stack at this moment: its processes are
        # gone and its own forget_broker_queue follows within milliseconds (CI once failed
        # here on such a race). Only what is still there a few seconds later is left behind.
        time.sleep(LEFTOVER_GRACE_S)
        found = {(b.key, b.member) for b in left}
        left = [b for b in abandoned(REDIS_URL) if (b.key, b.member) in found]
    forget(REDIS_URL, left)
    # a process killed during a remote-control ask (the reconciler's, the API's readiness
    # ask; 1 s) never unbinds its reply queue: kombu sweeps that table an hour after its last
    # use. Removed above, not a test's leftover.
    left = [b for b in left if not REPLY_QUEUE.fullmatch(b.queue)]
    if left:
        pytest.fail(
            "the tests left kombu bindings or unacked messages in Redis (now removed): "
            + ", ".join(sorted({f"{b.key} -> {b.queue}" for b in left})),
            pytrace=False,
        )


#: Test modules that take the longest (minutes of real processes each: a team's own app
#: run several times, the Compose services one by one, fault injection, the browser; a
#: property test of a thousand examples): collected first, so that pytest-xdist's workers
#: start them at once (each file whole in one process) and the many short unit tests fill in
#: around them at the end instead of leaving one worker on a long file while the others
#: idle (longest first; the suite's wall time is what CI limits).
SLOW_FIRST = (  # seconds each took in one run (--junitxml), 2,290 s in all
    "faults/test_soak.py",  # 311: a short chaos soak (three minutes of load, then checks)
    "integration/test_cli.py",  # 295: the demo, start to end, four times
    "conformance/test_conformance.py",  # 222 (in one process): 28 agent shapes, a real run each
    "faults/test_faults.py",  # 270
    "integration/test_api_pipeline.py",  # 225
    "integration/test_api_edges.py",  # 186
    "integration/test_middleware_runs.py",  # 110
    "integration/test_bounded_runs.py",  # 98
    "integration/test_ui.py",  # 91
    "integration/test_startup.py",  # 90
    "integration/test_hostile_input.py",  # 83
    "compaction/test_fact_cache.py",  # 83
    "integration/test_compose.py",  # 68
    "integration/test_middleware_timing.py",  # 67
    "test_deploy_files.py",  # 67
    "integration/test_cli_admin.py",  # 65
    "integration/test_security.py",  # 54
    "coordination/test_hook.py",  # 51
    "integration/test_own_agent.py",  # 49
    "compaction/test_revert_property.py",  # 46: one test of 1,000 examples
    "test_types.py",  # 41-70: mypy over the product, one test (it ended the suite as a unit test)
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the collected tests: :data:`SLOW_FIRST` modules first (in that order), then
    the other real-process tests, then the unit tests (a stable sort: each module's own
    order is kept)."""

    def rank(item: pytest.Item) -> int:
        path = item.path.as_posix()
        for i, name in enumerate(SLOW_FIRST):
            if path.endswith(name):
                return i
        return len(SLOW_FIRST) + (0 if ("/integration/" in path or "/faults/" in path) else 1)

    items.sort(key=rank)
