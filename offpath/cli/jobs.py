"""The ``offpath`` commands on a session's compaction jobs, through a running API:
``compact`` and ``revert``."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from offpath.cli.common import (
    ApiKeyOption,
    UrlOption,
    app,
    call_api,
    console,
    counted,
    fail,
    fmt_ms,
)


@app.command()
def compact(
    session_id: Annotated[str, typer.Argument(help="The session id")],
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    wait: Annotated[
        bool, typer.Option(help="Wait for the job to end and print how it ended")
    ] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the job", min=1)] = 120,
) -> None:
    """Compact a session now (POST /sessions/{id}/compact), under its threshold too; exits 1
    if there is nothing to compact, a job is in flight, or the job fails."""
    what = f"cannot compact {session_id!r}"
    done = call_api(url, api_key, "POST", f"/sessions/{session_id}/compact", what).json()
    console.print(f"job {done['job_id']}: {done['status']}", highlight=False)
    own = done.get("kind") == "own agent"
    if own:  # the agent's middleware applies it: say so
        console.print(done["detail"], highlight=False, markup=False)
    if not wait or done["status"] != "queued":
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = call_api(url, api_key, "GET", f"/sessions/{session_id}/compactions", what).json()
        job = next((j for j in jobs["jobs"] if j["job_id"] == done["job_id"]), None)
        if own and job is not None and job["status"] == "prepared":
            console.print(
                "prepared: the agent's middleware applies it at the thread's next model call",
                highlight=False,
            )
            return
        if job is not None and job["status"] in ("applied", "skipped", "failed", "reverted"):
            if job["status"] == "applied":
                saved = (
                    job["chars_saved"] if job["chars_saved"] is not None else job["chars_removed"]
                )
                console.print(
                    f"applied: -{counted(saved, 'char')} "
                    f"({counted(job['messages_removed'], 'message')} summarized by "
                    f"{job['summarizer']} in {fmt_ms(job['latency_ms'])})",
                    highlight=False,
                )
                return
            fail(f"job {done['job_id']} {job['status']}: {job['reason']}")
        time.sleep(0.5)
    fail(f"job {done['job_id']} did not end within {timeout:g}s (it goes on; see `offpath show`)")


def job_named(jobs: list[dict[str, Any]], name: str, what: str, session_id: str) -> str:
    """The id of the one job in ``jobs`` whose id is ``name`` or starts with it; exits 1
    with one line if none does or several do."""
    exact = [j["job_id"] for j in jobs if j["job_id"] == name]
    starting = [j["job_id"] for j in jobs if str(j["job_id"]).startswith(name)]
    if exact or len(starting) == 1:
        return str((exact or starting)[0])
    if not starting:
        fail(f"{what}: no job {name!r} (see `offpath show {session_id}`)")
    fail(f"{what}: {name!r} starts {len(starting)} job ids; give more of it")


@app.command()
def revert(
    session_id: Annotated[str, typer.Argument(help="The session id")],
    job_id: Annotated[
        str | None,
        typer.Argument(help="The compaction job to revert (default: the latest applied one)"),
    ] = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Revert a session's latest compaction: its originals go back in place of its summary.

    The originals come byte for byte from the archive (POST
    /sessions/{id}/compactions/{job}/revert). Exits 1 if it cannot be reverted now (the API
    says why) or the session has no applied compaction."""
    what = f"cannot revert a compaction of {session_id!r}"
    if job_id is not None and not job_id.strip():
        fail(f"{what}: give a job id, or leave it out for the latest applied compaction", code=2)
    jobs = call_api(url, api_key, "GET", f"/sessions/{session_id}/compactions", what).json()
    if job_id is None:
        applied = [j for j in jobs["jobs"] if j["status"] == "applied"]
        if not applied:
            fail(f"{what}: it has no applied compaction (see `offpath show {session_id}`)")
        job_id = applied[-1]["job_id"]
    else:  # a prefix as `offpath show` prints it names the one job it starts
        job_id = job_named(jobs["jobs"], job_id, what, session_id)
    done = call_api(
        url, api_key, "POST", f"/sessions/{session_id}/compactions/{job_id}/revert", what
    ).json()
    console.print(
        f"job {done['job_id']} reverted: {counted(done['messages_restored'], 'message')} and "
        f"{counted(done['results_restored'], 'shortened result')} put back; the thread has "
        f"{counted(done['messages'], 'message')}, {counted(done['chars'], 'char')}",
        highlight=False,
    )
