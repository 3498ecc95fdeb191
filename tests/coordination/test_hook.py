"""The post-turn hook and the job leases on real Redis and a real SQLite usage DB
(issue 3, item 3; issue 8, items 1, 2, 5 and 7)."""

from __future__ import annotations

import math
import threading
import time
import uuid

import pytest
import redis
from langchain_core.messages import AIMessage, HumanMessage
from shared import CASES, load, messages_of
from stack import REDIS_URL, wait_for

from offpath.config import load_settings
from offpath.coordination.hook import PostTurnHook
from offpath.coordination.runtime import Client
from offpath.stores.db.engine import make_engine, migrate
from offpath.stores.leases.claims import Held, LeaseKeeper, Leases, Start, State, failure_backoff_s
from offpath.stores.leases.key_stores import RedisKeyStore, SqlKeyStore


@pytest.fixture
def settings(tmp_path):
    s = load_settings(
        data_dir=str(tmp_path),
        summarization_threshold_chars=30_000,
        summarization_keep_chars=10_000,
    )
    migrate(s)
    return s


@pytest.fixture(params=["redis", "database"])
def leases(request, settings):
    """Leases on each claim store: Redis, and the usage database (LOCK_BACKEND=database)."""
    engine = make_engine(settings)
    client = redis.Redis.from_url(REDIS_URL)
    store = RedisKeyStore(client) if request.param == "redis" else SqlKeyStore(engine)
    prefix = f"leasetest-{uuid.uuid4().hex[:6]}"
    # 3 s: a heartbeat every second still renews on a host loaded by the parallel suite
    yield Leases(store, prefix=prefix, lease_s=3, queued_ttl_s=60)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)
    client.close()
    engine.dispose()


@pytest.fixture
def parts(settings, leases):
    engine = make_engine(settings)
    published: list[tuple[str, str]] = []
    client = Client(settings, engine, leases, lambda s, j, o: published.append((s, j)))
    hook = PostTurnHook(client)
    yield settings, engine, leases, hook, published
    engine.dispose()


def over_threshold():
    return messages_of(load(next(p for p in CASES if p.stem == "summary-first")))


def test_hook_queues_once_per_thread(parts):
    _, _, leases, hook, published = parts
    first = hook("t1", over_threshold())
    second = hook("t1", over_threshold())
    assert first.action == "queued" and second.action == "already_queued"
    assert published == [("t1", first.job_id)]
    assert leases.holder("t1").state is State.QUEUED


def test_a_store_outage_in_the_hook_is_one_line_without_a_traceback(parts, caplog):
    """The hook applies a prepared compaction on a thread over its threshold; the database
    it writes to does not answer (a real driver's refused connection). The turn is not
    failed, and the log says it in one warning naming the error, with no traceback (an
    outage is expected: the next turn tries again)."""
    import logging

    import sqlalchemy as sa

    settings, engine, leases, _, _ = parts
    job = uuid.uuid4().hex
    assert leases.set_from("t-out", None, Leases.after(job, State.PREPARED))
    gone = sa.create_engine("postgresql+psycopg://postgres@127.0.0.1:1/none")

    def apply(session_id: str, job_id: str) -> str:
        with gone.connect():  # the archive's write, on a database that is down
            return "applied"

    hook = PostTurnHook(Client(settings, engine, leases, lambda s, j, o: None), apply=apply)
    with caplog.at_level(logging.INFO, logger="offpath.hook"):
        assert hook("t-out", over_threshold()).action == "error"
    said = [r for r in caplog.records if r.name == "offpath.hook"]
    assert [(r.levelno, r.exc_info) for r in said] == [(logging.WARNING, None)]
    assert "OperationalError" in said[0].getMessage()
    gone.dispose()


def test_hook_skips_a_thread_under_the_threshold(parts):
    _, _, _, hook, published = parts
    assert hook("t2", over_threshold()[:5]).action == "skipped" and not published


def test_a_live_lease_is_never_taken_over_and_a_dead_one_lapses(parts):
    _, _, leases, hook, published = parts
    job = hook("t3", over_threshold()).job_id
    assert leases.start("t3", job, "tok")[0] is Start.OK
    keeper = LeaseKeeper(leases, max_age_s=60)
    held = keeper.hold("t3", job, "tok")
    time.sleep(leases.lease_s * 2)  # two lease lengths: renewed by the heartbeat
    assert hook("t3", over_threshold()).action == "already_queued"
    assert leases.holder("t3").raw == f"r:{job}:tok" and not held.lost.is_set()
    # the worker "dies": nothing renews the lease, which lapses within JOB_LEASE_S
    keeper.stop()
    time.sleep(leases.lease_s + 0.5)
    again = hook("t3", over_threshold())
    assert again.action == "queued" and again.job_id != job
    assert len(published) == 2


def test_a_second_delivery_of_a_running_job_is_a_duplicate_and_another_job_is_superseded(leases):
    assert leases.claim("t4", "j1") is None
    assert leases.start("t4", "j1", "a")[0] is Start.OK
    assert leases.start("t4", "j1", "b")[0] is Start.DUPLICATE
    assert leases.start("t4", "j2", "c")[0] is Start.SUPERSEDED
    assert leases.renew("t4", "j1", "a") and not leases.renew("t4", "j1", "b")


def test_a_delivery_that_finds_its_own_queued_claim_starts_in_one_round_trip(leases):
    """The usual start: the thread's claim is the job's own queued one, swapped for the running
    lease without reading it first; what held it before is that claim."""
    reads = []
    get = leases.store.get
    leases.store.get = lambda key: reads.append(key) or get(key)
    assert leases.claim("t10", "j1") is None
    reads.clear()
    started, before = leases.start("t10", "j1", "a")
    assert (started, before.raw, reads) == (Start.OK, "q:j1", [])
    assert leases.holder("t10").raw == "r:j1:a"
    assert leases.start("t10", "j2", "b")[0] is Start.SUPERSEDED  # another's: read, as before


def test_a_retry_keeps_the_thread_and_a_failure_holds_it_for_the_backoff(leases):
    assert leases.claim("t5", "j1") is None
    leases.start("t5", "j1", "a")
    assert leases.requeue("t5", "j1", "a")
    assert leases.claim("t5", "j2").job_id == "j1"  # waiting for its retry: still held
    assert leases.start("t5", "j1", "b")[0] is Start.OK
    assert leases.finish("t5", "j1", "b", Leases.after("j1", State.BACKOFF, backoff_s=1.5))
    held = leases.claim("t5", "j2")
    assert held.state is State.BACKOFF
    assert leases.start("t5", "j9", "x")[0] is Start.BACKOFF
    time.sleep(1.7)
    assert leases.claim("t5", "j2") is None


def test_failure_backoff_doubles_and_is_capped():
    assert [failure_backoff_s(n, 60, 3600) for n in range(0, 9)] == [
        0,
        60,
        120,
        240,
        480,
        960,
        1920,
        3600,
        3600,
    ]


def test_a_turn_that_read_the_thread_before_a_patch_landed_queues_nothing(parts):
    """Issue 8, item 7: the claim says which job compacted last; a view without its summary
    is superseded."""
    _, _, leases, hook, published = parts
    job = hook("t6", over_threshold()).job_id
    leases.start("t6", job, "a")
    leases.finish("t6", job, "a", Leases.after(job, State.DONE))
    stale_view = over_threshold()
    assert hook("t6", stale_view).action == "superseded"
    summary = HumanMessage(
        id="s",
        content="summary",
        additional_kwargs={"lc_source": "summarization", "summary": {"job_id": job}},
    )
    fresh_view = [summary, *over_threshold()]  # still over the threshold after it
    assert hook("t6", fresh_view).action == "queued"


def test_disabled_hook_touches_nothing():
    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the disabled hook used {name}")

    settings = load_settings(summarization_enabled=False)
    hook = PostTurnHook(Client(settings, Untouchable(), Untouchable(), Untouchable()))
    assert hook("t7", over_threshold()).action == "skipped"


def test_broker_down_is_reported_not_raised_and_the_job_is_recorded_unpublished(settings):
    engine = make_engine(settings)
    dead = Leases(
        RedisKeyStore(redis.Redis(port=1, socket_connect_timeout=0.5)),
        prefix="x",
        lease_s=3,
        queued_ttl_s=60,
    )
    hook = PostTurnHook(Client(settings, engine, dead, lambda s, j, o: None))
    first = hook("t8", over_threshold())
    second = hook("t8", over_threshold())
    assert first.action == "error" and "broker unreachable" in first.detail
    assert second.action == "error"
    from offpath.stores.db.job_queries import jobs_of

    (row,) = jobs_of(engine, "t8")  # one row for the reconciler, however many turns
    assert row["status"] == "queued" and not row["published"]
    engine.dispose()


def test_publish_failure_keeps_the_claim_and_records_the_job_unpublished(settings, leases):
    engine = make_engine(settings)

    def broken(session_id, job_id, options):
        raise ConnectionError("broker went away")

    hook = PostTurnHook(Client(settings, engine, leases, broken))
    result = hook("t9", over_threshold())
    assert result.action == "error"
    assert hook("t9", over_threshold()).action == "already_queued"
    from offpath.stores.db.job_queries import jobs_of

    (row,) = jobs_of(engine, "t9")
    # offpath's words and the error's class; the error's text is in the log only (issue 20, item 9)
    assert not row["published"] and row["reason"] == "publish failed (ConnectionError)"
    engine.dispose()


# --- the thread lock ---------------------------------------------------------------------


@pytest.fixture
def locks():
    from offpath.coordination.locks import ThreadLocks

    client = redis.Redis.from_url(REDIS_URL)
    yield ThreadLocks(client, timeout_s=10, wait_s=5, prefix=f"locktest-{uuid.uuid4().hex[:6]}")
    client.close()


def test_turns_posted_back_to_back_cannot_keep_a_patch_out(locks):
    """A client re-takes the lock within microseconds of releasing it; the patch announces
    that it waits and the next turn lets it go first (it used to time out after
    LOCK_WAIT_S, and the job retried with a second LLM call)."""
    import threading

    stop = threading.Event()
    turns = 0

    def client():
        nonlocal turns
        while not stop.is_set():
            with locks.turn("t"):
                time.sleep(0.02)  # a turn: the lock is free for well under 1% of the time
            turns += 1

    t = threading.Thread(target=client)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while turns < 3 and time.monotonic() < deadline:  # the turns are coming back to back
            time.sleep(0.01)
        before = turns
        with locks.patch("t"):  # LockUnavailable if starved for wait_s (5 s)
            pass
        while turns <= before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert t.is_alive() and turns > before  # and they went on after the patch got in
    finally:
        stop.set()
        t.join()


def test_a_patch_does_not_wait_for_an_agent_run(locks):
    from offpath.coordination.locks import RunInProgress, ThreadBusy

    with locks.turn("r", run=True):
        started = time.monotonic()
        with pytest.raises(RunInProgress):
            with locks.patch("r"):
                pass
        assert time.monotonic() - started < locks.wait_s
        with pytest.raises(ThreadBusy):
            with locks.turn("r"):
                pass


def test_more_threads_than_redis_connections_wait_for_one_instead_of_failing():
    """A worker runs WORKER_CONCURRENCY (128) jobs at once, each with Redis calls (leases,
    locks). redis-py's pool holds at most 100 connections and raises MaxConnectionsError
    past them (make bench's throughput run at x256 failed jobs so); offpath's client
    waits for a free connection instead."""
    from concurrent.futures import ThreadPoolExecutor

    from offpath.coordination.runtime import redis_client

    client = redis_client(REDIS_URL, load_settings())
    key = f"offpath-test-pool-{uuid.uuid4().hex}"

    def hold() -> None:  # a call that keeps its connection 0.3 s
        client.blpop([key], timeout=0.3)

    try:
        with ThreadPoolExecutor(max_workers=160) as pool:
            for future in [pool.submit(hold) for _ in range(160)]:
                future.result()
    finally:
        client.close()


def test_a_job_that_ends_while_its_lease_is_renewed_is_not_reported_lost(parts, caplog):
    """The lease keeper renews a snapshot of the held leases; a job that ends meanwhile (it
    drops its lease from the keeper, then hands the thread on) made the renewal fail and
    logged "lost its lease" for a job that had finished (make bench's logs, at every wave's
    end). Only a lease still held when its renewal fails is lost."""
    _, _, leases, hook, _ = parts
    job = hook("t9", over_threshold()).job_id
    assert leases.start("t9", job, "tok")[0] is Start.OK
    keeper = LeaseKeeper(leases, max_age_s=60)
    held = keeper.hold("t9", job, "tok")
    ended = threading.Event()
    renew = leases.renew

    def the_job_ends_first(session_id: str, job_id: str, token: str) -> bool:
        if session_id == "t9" and not ended.is_set():  # as worker.tasks does, in this order
            keeper.drop(held)
            leases.finish("t9", job, "tok", None)
            ended.set()
        return renew(session_id, job_id, token)

    leases.renew = the_job_ends_first
    try:
        with caplog.at_level("WARNING", logger="offpath"):
            assert ended.wait(leases.lease_s)  # the keeper's next beat ran
            time.sleep(0.1)
    finally:
        keeper.stop()
    assert not held.lost.is_set()
    assert "lost its lease" not in caplog.text


def test_a_lost_lease_says_whether_it_lapsed_or_was_taken_over(parts, caplog):
    """The warning of a lost lease names its kind: another holder replaced it while it was
    renewed in time ("taken over"), or no renewal came for a whole lease ("lapsed": the
    process was held up); an operator (and a test on a loaded host) tells them apart."""
    _, _, leases, hook, _ = parts
    job = hook("t10", over_threshold()).job_id
    assert leases.start("t10", job, "tok")[0] is Start.OK
    keeper = LeaseKeeper(leases, max_age_s=60)
    held = keeper.hold("t10", job, "tok")
    try:
        with caplog.at_level("WARNING", logger="offpath"):
            time.sleep(leases.lease_s / 2)  # renewed at least once meanwhile
            leases.store.swap(leases.key("t10"), f"r:{job}:tok", f"r:{job}:other", leases.lease_s)
            assert held.lost.wait(leases.lease_s)
    finally:
        keeper.stop()
    said = [r.getMessage() for r in caplog.records if "lost its lease" in r.getMessage()]
    assert len(said) == 1 and f"job {job} lost its lease on the thread (taken over" in said[0]
    # a lease last renewed a lease length or more before the renewal that found it gone
    late = Held("t10", job, "tok", renewed=100.0)
    assert keeper.why_lost(late, now=100.0 + leases.lease_s + 0.5).startswith(
        f"lapsed: renewed {leases.lease_s + 0.5:.1f}s ago"
    )
    assert keeper.why_lost(late, now=100.5).startswith("taken over: renewed 0.5s ago")


class Clock:
    """A clock the test moves: the hook's growth rates and latency refresh read it."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def grown(turns: int):
    """A thread of ``turns`` turns of ~1,250 chars each (a request and its answer)."""
    out = []
    for k in range(turns):
        out.append(HumanMessage(f"question {k}: " + "q" * 300, id=f"h{k}"))
        out.append(AIMessage(f"answer {k}: " + "a" * 930, id=f"a{k}"))
    return out


def drive(hook, session_id, clock, turns, every_s):
    """Turns appended ``every_s`` seconds apart from 10 turns on, the hook after each;
    returns ``(size, action)`` for each turn."""
    from offpath.compaction.accounting import total_chars

    out = []
    for n in range(10, turns + 1):
        messages = grown(n)
        clock.now += every_s
        out.append((total_chars(messages), hook(session_id, messages).action))
    return out


@pytest.mark.parametrize("leases", ["redis"], indirect=True)
def test_a_slow_thread_is_prepared_late_and_a_fast_one_at_the_floor(settings, leases):
    # the prepare floor is 24,000 chars of a 30,000 threshold; the summarizer's p90 is 5 s
    # (no compaction yet), a job's overhead 1.5 s: a thread growing a turn a minute (~21
    # chars/s) crosses long after a job would be done, one growing a turn every 0.1 s would
    # cross before
    engine = make_engine(settings)
    published: list[tuple[str, str]] = []
    client = Client(settings, engine, leases, lambda s, j, o: published.append((s, j)))
    clock = Clock()
    hook = PostTurnHook(client, clock=clock)
    try:
        slow = drive(hook, "slow", clock, 26, every_s=60.0)
        first = next(size for size, action in slow if action == "queued")
        assert all(action == "skipped" for size, action in slow if size < first)
        # queued within one turn's growth times the lead of the threshold, not at the floor
        assert first > settings.summarization_threshold_chars - 1_300
        assert any(size >= settings.prepare_floor_chars for size, a in slow if a == "skipped")
        fast = drive(hook, "fast", clock, 26, every_s=0.1)
        queued = [size for size, action in fast if action == "queued"]
        assert queued and queued[0] < settings.prepare_floor_chars + 1_300  # at the floor
        assert queued[0] >= settings.prepare_floor_chars
    finally:
        engine.dispose()


def test_the_prepare_point_is_the_floor_while_the_growth_is_unknown(parts):
    settings, _, _, hook, _ = parts
    assert hook.prepare_point(0.0) == settings.prepare_floor_chars
    assert hook.prepare_point(1e9) == settings.prepare_floor_chars  # fast: never earlier
    # 1 char/s over 6.5 s (p90 5 s, overhead 1.5 s) x 1.25
    assert hook.prepare_point(1.0) == int(settings.summarization_threshold_chars - 6.5 * 1.25)


def test_the_hook_stores_the_facts_of_a_thread_past_its_keep_window(settings):
    # the worker's job reads them by each message's key instead of finding them again
    from offpath.compaction.facts.extraction import key_digest

    engine = make_engine(settings)
    conn = redis.Redis.from_url(REDIS_URL)
    prefix = f"hookfacts-{uuid.uuid4().hex[:6]}"
    leases = Leases(RedisKeyStore(conn), prefix=prefix, lease_s=3, queued_ttl_s=60)
    client = Client(settings, engine, leases, lambda s, j, o: None, redis_conn=conn)
    client.settings = settings.model_copy(update={"redis_key_prefix": prefix})
    hook = PostTurnHook(client)
    try:
        small = grown(4)  # ~5,000 chars: under the keep window, nothing a compaction removes
        hook("s1", small)
        assert not list(conn.scan_iter(f"{prefix}:facts:*"))
        large = grown(12)  # ~15,000 chars: past it
        hook("s1", large)  # stored on the fact store's writer thread
        keys = [client.facts.key(key_digest(m)) for m in large]
        wait_for(lambda: conn.exists(*keys) == len(large), timeout=10)
    finally:
        for key in conn.scan_iter(f"{prefix}:*"):
            conn.delete(key)
        engine.dispose()
        conn.close()


def test_the_hook_never_waits_for_the_facts_it_stores(settings, tmp_path):
    """The facts of a turn's messages are stored on the fact store's writer thread: the hook
    (which the API runs after each imported turn, in the server's worker threads) returns
    while Redis holds their write back, and they are stored once Redis takes it."""
    from stack import free_port, start_redis

    from offpath.compaction.facts.extraction import key_digest

    port = free_port()
    proc = start_redis(port, tmp_path)  # private: a pause holds every client's writes
    conn = redis.Redis(port=port, socket_timeout=10)
    engine = make_engine(settings)
    leases = Leases(RedisKeyStore(conn), prefix="held", lease_s=3, queued_ttl_s=60)
    client = Client(settings, engine, leases, lambda s, j, o: None, redis_conn=conn)
    hook = PostTurnHook(client)
    try:
        large = grown(12)  # past the keep window, under the prepare floor: facts only
        conn.execute_command("CLIENT", "PAUSE", "3000", "WRITE")
        started = time.monotonic()
        assert hook("s1", large).action == "skipped"
        assert time.monotonic() - started < 1.5
        keys = [client.facts.key(key_digest(m)) for m in large]
        assert conn.exists(*keys) == 0  # still waiting for Redis
        wait_for(lambda: conn.exists(*keys) == len(large), timeout=15)
    finally:
        engine.dispose()
        conn.close()
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("leases", ["redis"], indirect=True)
def test_the_prepare_point_follows_the_first_measured_latency_within_seconds(settings, leases):
    # a fresh deployment paces by the default 5 s until its first compaction is measured;
    # from then on by the measured p90 (here 1 s), read again within LATENCY_RETRY_S, not a
    # minute later: a thread growing 100 chars/s gets its job 100 x (1 + 1.5) x 1.25 chars
    # before the threshold instead of 100 x (5 + 1.5) x 1.25
    from offpath.stores.db.tables import EVENTS
    from offpath.stores.usage.totals import LATENCY_RETRY_S

    engine = make_engine(settings)
    clock = Clock()
    hook = PostTurnHook(Client(settings, engine, leases, lambda s, j, o: None), clock=clock)
    threshold = settings.summarization_threshold_chars
    try:
        assert hook.prepare_point(100.0) == threshold - math.ceil(100 * 6.5 * 1.25)
        with engine.begin() as conn:
            conn.execute(
                EVENTS.insert(),
                [{"session_id": "s", "model": "m", "latency_ms": 1_000, "metadata": {}}],
            )
        clock.now += LATENCY_RETRY_S
        assert hook.prepare_point(100.0) == threshold - math.ceil(100 * 2.5 * 1.25)
    finally:
        engine.dispose()


@pytest.mark.parametrize("leases", ["redis"], indirect=True)
def test_the_job_starts_at_the_last_turn_that_has_it_ready_before_the_next_turn(settings, leases):
    # turns of ~1,254 chars; a job takes (5 s p90 + 1.5 s) x 1.25 = 8.1 s. One turn every
    # 4.1 s: queued at the last turn under the threshold, the job has two turns (8.2 s)
    # before the turn after the crossing, so it starts there, not a turn earlier (the growth
    # over a job is ~2,490 chars, nearly two turns). One turn a minute: queued by the
    # crossing turn, applied long before the next one; none paid for ahead.
    from offpath.compaction.accounting import total_chars

    engine = make_engine(settings)
    client = Client(settings, engine, leases, lambda s, j, o: None)
    clock = Clock()
    hook = PostTurnHook(client, clock=clock)
    threshold = settings.summarization_threshold_chars
    try:
        for name, every_s in (("paced", 4.1), ("slow", 60.0)):
            turns = drive(hook, name, clock, 26, every_s=every_s)
            queued = next(k for k, (_, action) in enumerate(turns) if action == "queued")
            crossing = next(k for k, (size, _) in enumerate(turns) if size > threshold)
            assert queued == (crossing - 1 if name == "paced" else crossing), turns
            assert total_chars(grown(10)) < settings.prepare_floor_chars  # began under the floor
    finally:
        engine.dispose()


def hook_with(settings, leases, applied: list):
    """A hook whose ``apply`` notes the job it was asked to apply and applies it."""
    engine = make_engine(settings)
    client = Client(settings, engine, leases, lambda s, j, o: None)
    return PostTurnHook(client, apply=lambda s, j: applied.append(j) or "applied"), engine


def between_floor_and_threshold(settings) -> tuple[list, int]:
    """A thread (and its size) over its prepare floor, under its threshold."""
    messages = over_threshold()
    size = (settings.prepare_floor_chars + settings.summarization_threshold_chars) // 2
    return messages[:4], size


@pytest.mark.parametrize(
    ("idle", "expected"), [(None, "never idle"), (-1.0, "idle too short"), (0.0, "idle long")]
)
def test_a_prepared_compaction_is_applied_under_the_threshold_once_the_thread_was_idle(
    settings, leases, idle, expected
):
    """A thread that stopped between its prepare floor and its threshold keeps its prepared
    compaction; back after SUMMARIZATION_IDLE_APPLY_S (or longer) it is applied at that turn,
    under the threshold; a turn after a shorter pause, or whose pause is unknown, leaves it
    prepared (it waits for the crossing)."""
    applied: list[str] = []
    hook, engine = hook_with(settings, leases, applied)
    job = uuid.uuid4().hex
    assert leases.set_from("t-idle", None, Leases.after(job, State.PREPARED))
    messages, size = between_floor_and_threshold(settings)
    idle_s = None if idle is None else settings.summarization_idle_apply_s + idle
    done = hook("t-idle", messages, size, idle_s=idle_s)
    engine.dispose()
    if expected == "idle long":
        assert (done.action, done.job_id, applied) == ("applied", job, [job])
    else:
        assert done.action != "applied" and not applied
        assert leases.holder("t-idle").state is State.PREPARED


def test_an_idle_thread_under_its_prepare_floor_or_with_idle_apply_off_keeps_its_compaction(
    tmp_path, leases
):
    """Applying after an idle time needs the thread over its prepare floor (a compaction
    lands it under it), and SUMMARIZATION_IDLE_APPLY_S=0 turns it off."""
    on = load_settings(
        data_dir=str(tmp_path),
        summarization_threshold_chars=30_000,
        summarization_keep_chars=10_000,
    )
    off = on.model_copy(update={"summarization_idle_apply_s": 0.0})
    migrate(on)
    messages, size = between_floor_and_threshold(on)
    for settings, chars in ((on, on.prepare_floor_chars - 1), (off, size)):
        applied: list[str] = []
        hook, engine = hook_with(settings, leases, applied)
        session = f"t-floor-{uuid.uuid4().hex[:6]}"
        assert leases.set_from(session, None, Leases.after(uuid.uuid4().hex, State.PREPARED))
        done = hook(session, messages, chars, idle_s=86_400.0)
        engine.dispose()
        assert done.action != "applied" and not applied
        assert leases.holder(session).state is State.PREPARED


#: One claim's life and a thread's facts through a Redis client: what the worker's job reads.
_CLAIMS_AND_FACTS = """
import json, sys, uuid
import redis
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from offpath.compaction.tokens import encoder
from offpath.stores.facts import FactStore
from offpath.stores.leases.claims import Leases
from offpath.stores.leases.key_stores import RedisKeyStore

encoder()  # tokens are stored with the facts where the process counts them
conn = redis.Redis.from_url(sys.argv[1])
prefix = f"parsers-{uuid.uuid4().hex[:6]}"
leases = Leases(RedisKeyStore(conn), prefix=prefix, lease_s=5, queued_ttl_s=60)
store = FactStore(conn, prefix, ttl_s=60)
thread = [
    HumanMessage("why is checkout-api failing? ticket INC-4821", id="h1"),
    AIMessage("Looking at pod checkout-api-7f9c4.", id="a1"),
    ToolMessage("pod checkout-api-7f9c4 OOMKilled, exit code 137", tool_call_id="c1", id="t1"),
]
try:
    out = {"claimed": leases.claim("s1", "j1") is None, "again": str(leases.claim("s1", "j2"))}
    start, before = leases.start("s1", "j1", "tok")
    out |= {"start": str(start), "before": str(before), "renewed": leases.renew("s1", "j1", "tok")}
    out |= {"holder": str(leases.holder("s1")), "finished": leases.finish("s1", "j1", "tok", None)}
    out |= {"after": str(leases.holder("s1")), "stored": store.remember(thread)}
    read = store.thread(thread)
    out |= {"tokens": read.tokens(), "taken": store.preload(thread[1:], read)}
    out |= {"missing": store.lookup([b"\\x00" * 16])[b"\\x00" * 16]}
    out["hiredis"] = type(conn.connection_pool.get_connection()._parser).__name__
    print(json.dumps(out))
finally:
    for key in conn.scan_iter(f"{prefix}:*"):
        conn.delete(key)
"""


def test_without_hiredis_redis_py_s_own_parser_gives_the_same_claims_and_facts():
    """hiredis (a dependency) parses Redis's replies and packs commands in C; without it
    (a platform with no wheel, a trimmed install) redis-py's own code does: a claim's life and
    a thread's facts and tokens read the same either way."""
    import json
    import subprocess
    import sys

    def run(*blocked: str) -> dict:
        code = "import sys\n" + "".join(f"sys.modules[{b!r}] = None\n" for b in blocked)
        done = subprocess.run(
            [sys.executable, "-c", code + _CLAIMS_AND_FACTS, REDIS_URL],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    with_c, without = run(), run("hiredis")
    assert with_c.pop("hiredis") == "_HiredisParser"
    assert without.pop("hiredis") != "_HiredisParser"
    assert with_c == without
    assert with_c["claimed"] and with_c["finished"] and with_c["taken"] == 2
    assert with_c["stored"] == 3 and all(isinstance(n, int) for n in with_c["tokens"])
