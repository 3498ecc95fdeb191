"""One compaction traced end to end: which of the product's files it runs.

``python -m bench.trace`` runs one compaction on each of two paths, each in a process of
its own, and prints the product files (under ``offpath/``, ``api/``, ``worker/``) whose
functions ran, with their count:

* ``own``: a team's own ``create_agent`` agent with ``OffPathCompaction`` (a scripted chat
  model calling a log tool, a SQLite checkpointer): its run crosses the threshold, the
  middleware queues a job, the worker prepares it, and the middleware applies it at a
  later model call of the same run;
* ``api``: ``POST /sessions/{id}/turns`` takes a thread of the API over its threshold, the
  post-turn hook queues a job, and the worker patches the thread's checkpoint.

The worker is the real Celery task (``compact_session``, applied in this process on a
thread of its own, as a worker's pool thread runs it; a process that has not run a job
yet, so it opens its runtime on this one). The trace starts once the agent is built (own)
or the API is up (api) and ends when the job is recorded: start-up and imports are not
counted (a module's top level is not a function), only what the compaction calls.
``sys.settrace`` and ``threading.settrace`` see every thread the compaction starts.

Real Redis (``BENCH_REDIS_URL``, db 14 by default) and SQLite under a temporary folder; no
LLM (the offline summarizer). ``--json`` prints the files as JSON (tests read it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The product's folders; a file under one is a product file.
PRODUCT = ("offpath", "api", "worker")
PATHS = ("own", "api")

#: Sizes that make one compaction quick: a 6,000-char threshold, a 2,000-char keep window.
THRESHOLD_CHARS = 6_000
KEEP_CHARS = 2_000
#: Longest one path may take (s).
TIMEOUT_S = 120.0


class Tracer:
    """Records the product files whose functions run, on every thread, while it is on."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self._product: dict[str, str | None] = {}
        self._roots = tuple(f"{ROOT / p}{os.sep}" for p in PRODUCT)

    def _relative(self, filename: str) -> str | None:
        try:
            return self._product[filename]
        except KeyError:
            real = os.path.realpath(filename)
            rel = os.path.relpath(real, ROOT) if real.startswith(self._roots) else None
            self._product[filename] = rel
            return rel

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "call" and code.co_name != "<module>":
            rel = self._relative(code.co_filename)
            if rel is not None:
                self.files.add(rel)

    def __enter__(self) -> Tracer:
        threading.settrace(self)
        sys.settrace(self)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]


def _environment(folder: str) -> None:
    """The settings both sides read (one source: the environment)."""
    os.environ.update(
        {
            "DATA_DIR": folder,
            "DATABASE_URL": "",
            "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
            "REDIS_KEY_PREFIX": f"bench-trace-{uuid.uuid4().hex[:8]}",
            "SUMMARIZATION_THRESHOLD_CHARS": str(THRESHOLD_CHARS),
            "SUMMARIZATION_KEEP_CHARS": str(KEEP_CHARS),
            "OPENAI_API_KEY": "",
            "OPENAI_BASE_URL": "",
            "LOG_LEVEL": "WARNING",
        }
    )


def _worker_publisher(done: dict[str, Any]) -> Any:
    """A publisher that runs each job as the worker does, on a thread of its own (the real
    ``compact_session`` task, applied in this process); ``done[job id]`` is how it ended."""
    from offpath.worker.tasks import compact_session

    def run(session_id: str, job_id: str, options: dict[str, Any] | None) -> None:
        result = compact_session.apply(args=(session_id, options), task_id=job_id)
        done[job_id] = result.result

    def publish(session_id: str, job_id: str, options: dict[str, Any] | None) -> None:
        name = f"worker-{job_id[:8]}"
        threading.Thread(target=run, args=(session_id, job_id, options), name=name).start()

    return publish


def _wait_recorded(engine: Any, session_id: str) -> str:
    """Wait for the thread's job to be recorded ``applied``; returns its id."""
    import sqlalchemy as sa

    from offpath.stores.db.tables import JOBS

    deadline = time.monotonic() + TIMEOUT_S
    query = sa.select(JOBS.c.job_id).where(
        JOBS.c.session_id == session_id, JOBS.c.status == "applied"
    )
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            job = conn.execute(query).scalar()
        if job is not None:
            return str(job)
        time.sleep(0.05)
    raise RuntimeError(f"no compaction of {session_id} was recorded in {TIMEOUT_S:.0f} s")


def trace_own(folder: str) -> set[str]:
    """A team's own agent: a run that crosses its threshold and applies the prepared job."""
    from langchain.agents import create_agent
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool
    from langgraph.checkpoint.sqlite import SqliteSaver

    from offpath import OffPathCompaction
    from offpath.compaction.summary import is_summary
    from offpath.config import get_settings
    from offpath.coordination.runtime import Client
    from offpath.stores.db.engine import migrate

    @tool
    def fetch_logs(page: int) -> str:
        """One page of the checkout service's logs."""
        return "\n".join(
            f"12:{page:02d}:{k:02d} checkout-api-{k % 3} GET /cart 200" for k in range(40)
        )

    class Scripted(BaseChatModel):
        """Reads log pages until the run's requests carry a summary, then answers."""

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Scripted:
            return self

        def _generate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> ChatResult:
            calls = sum(1 for m in messages if m.type == "ai")
            if any(is_summary(m) for m in messages) or calls >= 60:
                answer = AIMessage(content="The checkout pods answer 200.")
            else:
                time.sleep(0.2)  # the worker prepares meanwhile, as while a real model thinks
                call = {"id": f"call-{calls}", "name": "fetch_logs", "args": {"page": calls}}
                answer = AIMessage(content="", tool_calls=[call])
            return ChatResult(generations=[ChatGeneration(message=answer)])

    settings = get_settings()
    migrate(settings)  # as `offpath migrate` and the worker's start-up do
    db = Path(folder) / "agent.db"
    done: dict[str, Any] = {}
    client = Client.open(settings, publish=_worker_publisher(done))
    with SqliteSaver.from_conn_string(str(db)) as saver:
        middleware = OffPathCompaction(settings, checkpointer_url=f"sqlite:///{db}", client=client)
        agent = create_agent(Scripted(), [fetch_logs], middleware=[middleware], checkpointer=saver)
        session = f"own-{uuid.uuid4().hex[:8]}"
        config = {"configurable": {"thread_id": session}}
        with Tracer() as tracer:
            agent.invoke(
                {"messages": [HumanMessage("Is checkout healthy? Read its logs.")]}, config
            )
            _wait_recorded(client.engine, session)
    client.close()
    return tracer.files


def trace_api(folder: str) -> set[str]:
    """The API: an imported turn takes the thread over its threshold; the worker patches it."""
    from fastapi.testclient import TestClient

    from offpath.api.app import create_app
    from offpath.stores.tenants import create_key

    done: dict[str, Any] = {}
    app = create_app(publish=_worker_publisher(done))
    session = f"api-{uuid.uuid4().hex[:8]}"
    turn = []
    for k in range(8):
        call = {"id": f"c{k}", "name": "fetch_logs", "args": {"page": k}}
        turn += [
            {"role": "user", "content": f"Read page {k} of the checkout logs."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {
                "role": "tool",
                "tool_call_id": f"c{k}",
                "content": f"page {k}: " + "GET /cart 200\n" * 60,
            },
            {"role": "assistant", "content": f"Page {k}: every request answered 200."},
        ]
    with TestClient(app, base_url="http://127.0.0.1") as http:
        rt = app.state.rt
        key = create_key(rt.engine, "trace", admin=True)
        headers = {"Authorization": f"Bearer {key}"}
        with Tracer() as tracer:
            answer = http.post(
                f"/sessions/{session}/turns", json={"messages": turn}, headers=headers
            )
            assert answer.status_code == 200, answer.text
            _wait_recorded(rt.engine, session)
    return tracer.files


def trace(path: str) -> list[str]:
    """The product files one compaction runs on ``path`` (``own`` or ``api``), sorted; run in
    a process of its own (each path starts from a fresh worker)."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.trace", "--path", path, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S + 60,
    )
    if out.returncode != 0:
        raise RuntimeError(f"bench.trace --path {path} failed:\n{out.stderr[-3000:]}")
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.trace", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--path", choices=PATHS, help="one path, in this process (default: both)")
    parser.add_argument("--json", action="store_true", help="print the files as a JSON list")
    args = parser.parse_args()
    if args.path is None:
        for path in PATHS:
            files = trace(path)
            print(f"{path}: {len(files)} product files")
            for f in files:
                print(f"  {f}")
        return
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as folder:
        _environment(folder)
        files = sorted((trace_own if args.path == "own" else trace_api)(folder))
    if args.json:
        print(json.dumps(files))
    else:
        print("\n".join(files))


if __name__ == "__main__":
    main()
