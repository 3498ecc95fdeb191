"""Start-up of many processes at once (issues 14, 15): migrations and the checkpointer's
tables are created once, whoever comes first, on PostgreSQL and on SQLite; an API whose
Redis is down says so at start-up."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from stack import BIN, ROOT, create_pg_database, drop_pg_database, free_port, stop_group, wait_for

N = 6

#: Imports first, then waits for the same instant as the others (START_AT), so the
#: processes reach the database together instead of one import time apart.
MIGRATE = """
import os, sys, time
import alembic.command, offpath.cli.main, offpath.stores.db
time.sleep(max(0.0, float(os.environ["START_AT"]) - time.time()))
sys.argv = ["offpath", "migrate"]
offpath.cli.main.app()
"""

CHECKPOINTS = """
import os, time
from offpath.config import load_settings
from offpath.stores.checkpoints import open_checkpoints
import langgraph.checkpoint.postgres, langgraph.checkpoint.sqlite
settings = load_settings(database_url=os.environ["RACE_DATABASE_URL"])
time.sleep(max(0.0, float(os.environ["START_AT"]) - time.time()))
with open_checkpoints(settings) as checkpoints:
    checkpoints.ping()
print("checkpoints ready")
"""


def run_at_once(code: str, env: dict[str, str]) -> list[tuple[int, str]]:
    """Run ``code`` in N processes that start their real work at the same moment."""
    start_at = time.time() + 4  # after every process has imported what it needs
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            cwd=ROOT,
            env={**os.environ, "START_AT": str(start_at), **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(N)
    ]
    try:
        return [(p.wait(timeout=120), p.stdout.read()) for p in procs]  # type: ignore[union-attr]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture(params=["postgres", "sqlite"])
def fresh_database(request: pytest.FixtureRequest, tmp_path: Path):
    """(DATABASE_URL, DATA_DIR) of an empty database."""
    if request.param == "sqlite":
        yield "", tmp_path / "data"
        return
    url = create_pg_database()
    try:
        yield url, tmp_path / "data"
    finally:
        drop_pg_database(url)


def test_concurrent_migrations_all_succeed(fresh_database):
    url, data_dir = fresh_database
    results = run_at_once(MIGRATE, {"DATABASE_URL": url, "DATA_DIR": str(data_dir)})
    failed = [out for code, out in results if code != 0]
    assert not failed, f"{len(failed)} of {N} migrations failed:\n" + "\n---\n".join(failed)
    outs = [out for _, out in results]
    assert sum("created" in o for o in outs) == 1, outs
    assert sum("up to date" in o for o in outs) == N - 1, outs


def test_concurrent_checkpointer_setup_all_succeed(fresh_database):
    url, data_dir = fresh_database
    results = run_at_once(CHECKPOINTS, {"RACE_DATABASE_URL": url, "DATA_DIR": str(data_dir)})
    failed = [out for code, out in results if code != 0]
    assert not failed, f"{len(failed)} of {N} set-ups failed:\n" + "\n---\n".join(failed)


def test_api_warns_at_start_up_when_redis_is_down(tmp_path):
    """Issue 15: the API starts (turns need neither the broker nor Redis) but says so."""
    port, redis_port = free_port(), free_port()  # nothing listens on redis_port
    log = tmp_path / "api.log"
    env = {
        **os.environ,
        "DATA_DIR": str(tmp_path / "data"),
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "LOG_LEVEL": "INFO",
    }
    with open(log, "wb") as out:
        api = subprocess.Popen(
            [
                str(BIN / "uvicorn"),
                "offpath.api.app:app",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

            def answers() -> int | None:
                assert api.poll() is None, log.read_text()
                try:
                    return client.get("/healthz").status_code
                except httpx.TransportError:
                    return None

            assert wait_for(answers, timeout=60, interval=0.1) == 503
        text = log.read_text()
        warnings = [line for line in text.splitlines() if "unreachable at start-up" in line]
        assert len(warnings) == 1, text
        line = warnings[0]
        assert "WARNING" in line and f"redis://127.0.0.1:{redis_port}/0" in line, line
        assert "broker and lock store" in line, line
        assert "compaction jobs are not queued until it is back" in line, line
    finally:
        stop_group(api)
