"""Reverting a compaction of offpath's own thread (issue 19), in process on the real stores:
the checkpointer and usage tables on SQLite and PostgreSQL, claims and locks on Redis. The
thread after a revert is the thread before the compaction, read back through the
checkpointer; the job ends ``reverted``; the thread is not compacted again at once; ``/stats``
stops counting what it saved; and each case the API answers 409 is refused by name. The API
itself: ``tests/integration/test_revert.py``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages import messages_to_dict as to_dicts
from stack import ROOT, small_runtime

from offpath.compaction.accounting import total_chars
from offpath.compaction.patch import Prepared
from offpath.compaction.planner import Skip, plan_compaction
from offpath.compaction.tracking import KEY, ThreadSize
from offpath.coordination.hook import PostTurnHook
from offpath.coordination.jobs import JobOptions
from offpath.coordination.locks import ThreadBusy
from offpath.coordination.revert import NoSuchJob, RevertRefused, revert
from offpath.coordination.runtime import Runtime
from offpath.coordination.writers import apply_prepared
from offpath.stores import archive
from offpath.stores.checkpoints import read_thread
from offpath.stores.db.job_queries import job_row, threads_to_requeue
from offpath.stores.db.tables import JobStatus, now_utc
from offpath.stores.db.transitions import create_job, set_job, store_result
from offpath.stores.leases.claims import Claim, Leases, State
from offpath.stores.search import search
from offpath.stores.usage.stats_body import stats


@pytest.fixture(params=["sqlite", "postgres"])
def rt(request, tmp_path):
    with small_runtime(request.param, tmp_path, "test-revert") as runtime:
        yield runtime


def turn(k: int) -> list:
    """One turn: a question, a call, a result with facts in it, an answer."""
    call = {"id": f"c{k}", "name": "kubectl", "args": {"cmd": f"logs ledger-db-shard-{k}"}}
    return [
        HumanMessage(id=f"h{k}", content=f"check shard {k} (ticket OPS-{900 + k})"),
        AIMessage(id=f"a{k}", content="", tool_calls=[call]),
        ToolMessage(
            id=f"t{k}",
            tool_call_id=f"c{k}",
            content=f"ledger-db-shard-{k}: lag {k * 10}s\n" + "ok\n" * 600,
        ),
        AIMessage(id=f"r{k}", content=f"Shard {k} lags {k * 10}s."),
    ]


def write(rt: Runtime, session: str, messages: list) -> None:
    """Append ``messages`` as ``/turns`` does (the thread's size kept in its private key)."""
    thread = read_thread(rt.checkpoints.saver, session)
    size = ThreadSize().advance([*thread.messages, *messages])
    rt.patch(session, {"messages": messages, KEY: {"size": size.to_state()}}, thread.base)


def compact(rt: Runtime, session: str, *, options: JobOptions | None = None) -> str:
    """One compaction job prepared and applied as the worker and the hook do it; its id."""
    job = uuid.uuid4().hex
    messages = read_thread(rt.checkpoints.saver, session).messages
    plan = plan_compaction(messages, rt.settings, force=True)
    assert not isinstance(plan, Skip), plan
    opts = (options or JobOptions()).to_json()
    create_job(rt.engine, job, session, total_chars(messages), options=opts)
    prepared = Prepared.from_plan(
        plan, job_id=job, summary_text="Shards checked; OPS-900 open.", summarizer="t", model="m"
    )
    usage = {"input_tokens": 10, "output_tokens": 5, "latency_ms": 7}
    store_result(
        rt.engine, job, {"prepared": prepared.to_json(), "usage": usage}, JobStatus.PREPARED
    )
    assert rt.leases.set_from(session, rt.leases.holder(session), Leases.after(job, State.PREPARED))
    assert apply_prepared(rt, session, job) == "applied"
    return job


def thread_dicts(rt: Runtime, session: str) -> list:
    return to_dicts(read_thread(rt.checkpoints.saver, session).messages)


def started(rt: Runtime, turns: int = 6) -> tuple[str, list]:
    session = f"rv-{uuid.uuid4().hex[:8]}"
    write(rt, session, [SystemMessage(id="sys", content="You are an SRE agent.")])
    for k in range(turns):
        write(rt, session, turn(k))
    return session, thread_dicts(rt, session)


def test_revert_puts_the_originals_back_and_the_thread_is_not_compacted_again_at_once(rt):
    session, before = started(rt)
    job = compact(rt, session)
    assert thread_dicts(rt, session) != before
    loss = job_row(rt.engine, job)["result"]["record"]["loss"]
    assert loss["messages_removed"] > 0 and loss["facts"] >= loss["facts_lost"] > 0
    saved = stats(rt.engine, session_id=session)["summary"]
    assert saved["total_chars_compacted"] > 0 and saved["sessions_compacted"] == 1

    done = revert(rt, session, job)
    assert thread_dicts(rt, session) == before  # byte for byte, through the checkpointer
    row = job_row(rt.engine, job)
    assert (row["status"], row["reason_code"]) == ("reverted", "reverted")
    assert done.messages == len(before) and done.messages_restored == loss["messages_removed"]
    assert done.results_restored == loss["results_shortened"] >= 1  # kept results it shortened
    values = read_thread(rt.checkpoints.saver, session).base.checkpoint["channel_values"]
    messages = read_thread(rt.checkpoints.saver, session).messages
    assert values[KEY]["size"] == ThreadSize().advance(messages).to_state()
    # the claim says "skipped at this size": no new job before the thread grew
    claim = rt.leases.holder(session)
    assert (claim.state, claim.job_id, claim.chars) == (State.SKIPPED, job, total_chars(messages))
    assert total_chars(messages) > rt.settings.summarization_threshold_chars
    hook = PostTurnHook(rt, apply=lambda *a: "gone")
    assert hook(session, messages).action == "skipped"
    since = now_utc() - timedelta(hours=1)
    assert session not in {s for s, _ in threads_to_requeue(rt.engine, since)}
    # /stats: the summarizer ran (counted), nothing it removed is removed now
    after = stats(rt.engine, session_id=session)["summary"]
    assert after["total_summarizations"] == 1 and after["llm_tokens"]["input"] == 10
    assert after["total_chars_compacted"] == 0 and after["sessions_compacted"] == 0
    assert after["approx_tokens_saved"] == 0
    assert after["jobs"]["reverted"] == 1 and after["jobs"]["applied"] == 0


def test_a_folded_compaction_comes_back_once_the_later_one_is_reverted(rt):
    session, before = started(rt, turns=5)
    first = compact(rt, session)
    after_first = thread_dicts(rt, session)
    for k in range(5, 9):
        write(rt, session, turn(k))
    grown = thread_dicts(rt, session)
    second = compact(rt, session)  # folds the first summary in
    with pytest.raises(RevertRefused, match=f"job {second}\\) folded it in"):
        revert(rt, session, first)
    revert(rt, session, second)
    assert thread_dicts(rt, session) == grown
    assert grown[: len(after_first)] == after_first
    revert(rt, session, first)  # its summary is back: it is the latest now
    assert thread_dicts(rt, session)[: len(before)] == before
    assert thread_dicts(rt, session) == before + grown[len(after_first) :]


def test_what_cannot_be_reverted_is_refused_and_changes_nothing(rt):
    session, _ = started(rt)
    job = compact(rt, session)
    now = thread_dicts(rt, session)
    with pytest.raises(NoSuchJob):
        revert(rt, session, "no-such-job")
    other, _ = started(rt)
    with pytest.raises(NoSuchJob):
        revert(rt, other, job)  # another session's job
    claim = rt.leases.holder(session)
    for busy in (Claim.parse("q:x"), Claim.parse("r:x:token")):  # a job holds the thread
        assert rt.leases.set_from(session, claim, busy)
        with pytest.raises(RevertRefused, match="is (queued|running) on this session"):
            revert(rt, session, job)
        assert rt.leases.set_from(session, busy, claim)
    with rt.locks.turn(session, run=True), pytest.raises(ThreadBusy):  # a run holds it
        revert(rt, session, job)
    assert thread_dicts(rt, session) == now and job_row(rt.engine, job)["status"] == "applied"
    revert(rt, session, job)
    with pytest.raises(RevertRefused, match="reverted already"):
        revert(rt, session, job)
    pending = uuid.uuid4().hex
    create_job(rt.engine, pending, session, 1)
    with pytest.raises(RevertRefused, match="queued: only an applied"):
        revert(rt, session, pending)


def test_a_team_agents_thread_is_refused_saying_why(rt):
    session, before = started(rt)
    job = compact(rt, session, options=JobOptions(patch=False))
    with pytest.raises(RevertRefused, match="never writes"):
        revert(rt, session, job)
    assert job_row(rt.engine, job)["status"] == "applied"


def test_a_compaction_prepared_on_the_summary_ends_superseded(rt):
    session, before = started(rt)
    job = compact(rt, session)
    compacted = thread_dicts(rt, session)
    for k in range(6, 9):
        write(rt, session, turn(k))
    since = thread_dicts(rt, session)[len(compacted) :]
    waiting = uuid.uuid4().hex
    create_job(rt.engine, waiting, session, 1)
    set_job(rt.engine, waiting, session, JobStatus.PREPARED)
    claim = rt.leases.holder(session)
    assert rt.leases.set_from(session, claim, Leases.after(waiting, State.PREPARED))
    revert(rt, session, job)
    row = job_row(rt.engine, waiting)
    assert (row["status"], row["reason_code"]) == ("skipped", "superseded")
    assert thread_dicts(rt, session) == before + since  # later messages untouched


def test_a_revert_killed_after_its_write_is_finished_by_the_next_one(rt):
    """The failpoint ``after_revert_patch`` kills the process between the checkpoint write
    and the job's row: the thread holds the originals, the job still reads ``applied``; the
    next revert records it (nothing is written twice)."""
    session, before = started(rt)
    job = compact(rt, session)
    s = rt.settings
    script = (
        "import sys\n"
        "from offpath.config import load_settings\n"
        "from offpath.agent.graph import open_runtime\n"
        "from offpath.coordination.revert import revert\n"
        f"rt = open_runtime(load_settings(data_dir={s.data_dir!r}, database_url="
        f"{s.database_url!r}, redis_url={s.redis_url!r}, redis_key_prefix="
        f"{s.redis_key_prefix!r}, lock_timeout_s=2), publish=lambda *a: None)\n"
        f"revert(rt, {session!r}, {job!r})\n"
    )
    env = {**os.environ, "OFFPATH_FAILPOINTS": "after_revert_patch"}
    killed = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, timeout=120)
    assert killed.returncode == -9
    assert thread_dicts(rt, session) == before
    assert job_row(rt.engine, job)["status"] == "applied"
    # the dead process's lock expires (LOCK_TIMEOUT_S, 2 s here): then the revert goes on
    deadline = time.monotonic() + 60
    while True:
        try:
            done = revert(rt, session, job)
            break
        except ThreadBusy:
            assert time.monotonic() < deadline, "the dead process's lock never expired"
            time.sleep(0.2)
    assert job_row(rt.engine, job)["status"] == "reverted"
    assert thread_dicts(rt, session) == before and done.messages == len(before)


def test_a_restored_result_shortened_anew_keeps_its_original_readable(rt):
    """A result the reverted compaction had shortened is whole again; shortened anew (as a
    run's middleware does), it writes no second row (a result keeps its first): the first row
    stays readable, by ``recall`` and by its id."""
    session, before = started(rt)
    job = compact(rt, session)
    revert(rt, session, job)
    thread = read_thread(rt.checkpoints.saver, session).messages
    restored = next(m for m in thread if m.id == "t5")
    shortened = archive.shorten_archived(rt.engine, session, thread, {"t5": 1_200})
    short = next(m for m in shortened if m.id == "t5")
    assert len(str(short.content)) < len(str(restored.content))
    assert archive.original(rt.engine, session, "t5") == to_dicts([restored])[0]
    found = search(rt.engine, session, "ledger-db-shard-5")
    assert "t5" in {f["message_id"] for f in found}


def test_a_job_waits_for_the_checkpoint_to_hold_the_runs_latest_apply(rt):
    """Issue 18 (benchmark 17 under load: "stale: message ...-0001 changed since the summary
    was prepared", again and again): after an apply in the run, the newest message a job
    names is already in the checkpoint, the new summary only a step later. The job names the
    run's first message as well (``JobOptions.head``), and the worker's read waits for it."""
    import threading
    import time

    from offpath.compaction.shorten import digest
    from offpath.coordination.jobs import head_mark
    from offpath.worker.jobs import read_caught_up

    session, _ = started(rt, turns=2)
    saver = rt.checkpoints.saver
    messages = read_thread(saver, session).messages
    newest = messages[-1].id
    rewritten = HumanMessage(id="h0", content="[summary] shards 0-1 checked")
    wanted = f"h0:{digest(rewritten)}"
    assert head_mark(messages) != wanted
    # without the head, the checkpoint holding the newest message is enough: the old head
    assert head_mark(read_caught_up(saver, session, newest, 5.0).messages) != wanted
    later = threading.Timer(0.4, lambda: write(rt, session, [rewritten]))
    start = time.monotonic()
    later.start()
    thread = read_caught_up(saver, session, newest, 5.0, head=wanted)
    later.join()
    assert head_mark(thread.messages) == wanted and time.monotonic() - start >= 0.4
    assert JobOptions.from_json(JobOptions(head=wanted).to_json()).head == wanted


def test_a_loss_report_made_after_the_swap_fills_only_its_own_compactions_record(rt):
    """The middleware makes an in-run apply's loss report after the swap (issue 18: off the
    model call's path) and stores it into the job's record: only into the record of the
    summary it was made for, not into one another apply of the job stored since."""
    session, _ = started(rt)
    job = compact(rt, session)
    record = job_row(rt.engine, job)["result"]["record"]
    report = {"messages_removed": record["messages_removed"], "facts": 1, "facts_lost": 0}
    assert not archive.store_loss(rt.engine, job, "another-summary", report)
    assert job_row(rt.engine, job)["result"]["record"] == record
    assert archive.store_loss(rt.engine, job, record["summary_id"], report)
    stored = job_row(rt.engine, job)["result"]
    assert stored["record"] == {**record, "loss": report} and "prepared" in stored


def test_a_late_ending_never_changes_an_applied_or_reverted_job(rt):
    """Two deliveries of one job (the reconciler re-published it after a broker outage): the
    second applied it, then the first ends on its lost lease. The row keeps saying what
    happened to the thread: applied, and after a revert, reverted."""
    from offpath.coordination.jobs import JobEnded

    session, _ = started(rt)
    job = compact(rt, session)
    late = JobEnded(JobStatus.FAILED, "lease_lost", "lease lost before the patch; not applied")
    assert rt.jobs.end(session, job, late) is False
    assert job_row(rt.engine, job)["status"] == "applied"
    revert(rt, session, job)
    assert rt.jobs.end(session, job, late) is False
    assert job_row(rt.engine, job)["status"] == "reverted"
    # an open job still ends as it is told
    other = uuid.uuid4().hex
    create_job(rt.engine, other, session, 100)
    assert rt.jobs.end(session, other, late) is True
    assert job_row(rt.engine, other)["status"] == "failed"
