"""The ``recall`` tool (issue 11, item 4) in a real ``create_agent`` run, on a real SQLite
archive: the middleware gives the agent the tool, and it reads only its own thread's
originals of compactions that applied."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from stack import migrated_engine

from offpath.agent import recall
from offpath.agent.middleware.hooks import OffPathCompaction
from offpath.compaction.summary import cite
from offpath.config import load_settings
from offpath.stores import archive
from offpath.stores.db.engine import make_engine, migrate
from offpath.stores.db.tables import JOBS
from offpath.stores.db.transitions import create_job
from offpath.stores.search import EXCERPT_MAX_CHARS


class ToolModel(GenericFakeChatModel):
    """The fake chat model, with tools bound (it answers from its script regardless)."""

    def bind_tools(self, tools, **kwargs):
        return self


ORIGINAL = ToolMessage(
    id="t-17",
    content="checkout-api-7f9c4 returned ERR-5012 while db-primary-2 was failing over",
    tool_call_id="c-17",
    name="logs",
)


def archived(tmp_path, status="applied"):
    settings = load_settings(data_dir=str(tmp_path))
    migrate(settings)
    engine = make_engine(settings)
    for thread, job in [("inc-1", "job-1"), ("inc-2", "job-2")]:
        create_job(engine, job, thread, 100)
        rows = archive.rows_for(thread, job, "summary-1", [ORIGINAL], [ORIGINAL.id])
        archive.store_record(engine, job, {"summary": "s"}, rows)
    with engine.begin() as conn:
        conn.execute(sa.update(JOBS).where(JOBS.c.job_id == "job-1").values(status=status))
    return settings, engine


def test_recall_finds_words_and_ids_of_applied_compactions_only(tmp_path):
    _, engine = archived(tmp_path)
    found = recall.answer(engine, "inc-1", "ERR-5012")
    assert found.startswith("[t-17] (tool)") and "[ERR-5012]" in found
    assert recall.answer(engine, "inc-1", "t-17").endswith(ORIGINAL.content)
    # inc-2 has the same original, but its job never applied: not shown
    assert "nothing archived" in recall.answer(engine, "inc-2", "ERR-5012")
    assert "nothing archived" in recall.answer(engine, "inc-1", "ENOSPC")
    assert "give some words" in recall.answer(engine, "inc-1", "   ")


def test_recall_calls_a_query_no_store_holds_bad_input(tmp_path):
    """Issue 34, item 6: a NUL or a lone surrogate in the query was answered "the archive could
    not be read ... try later" (PostgreSQL refused the query): it is bad input, said so before
    the archive is asked (so on both backends alike)."""
    _, engine = archived(tmp_path)
    for query, held in (("ERR\x005012", "a NUL character"), ("ERR \ud800", "a lone UTF-16")):
        answer = recall.answer(engine, "inc-1", query)
        assert answer.startswith(f"recall: bad input: the query holds {held}"), answer
        assert "try later" not in answer


def test_recall_reads_a_message_by_the_id_a_summary_cites(tmp_path):
    # issue 19: a summary cites a UUID by its first 8 hex chars; recall resolves them within
    # the thread, and only when one archived message has them (a prefix two ids share, or
    # another thread's id, is searched as words instead)
    settings = load_settings(data_dir=str(tmp_path))
    migrate(settings)
    engine = make_engine(settings)
    uid = "3f2a9c1e-0b7d-4c55-9e21-6a4f0c2d8b17"
    twins = ["77aa00bb-0000-4000-8000-000000000001", "77aa00bb-0000-4000-8000-000000000002"]
    messages = [
        ToolMessage(id=uid, content="ERR-5012 on db-primary-2", tool_call_id="c1"),
        *(ToolMessage(id=t, content=f"twin {t}", tool_call_id="c2") for t in twins),
    ]
    create_job(engine, "job-1", "inc-1", 100)
    rows = archive.rows_for("inc-1", "job-1", "summary-1", messages, [m.id for m in messages])
    archive.store_record(engine, "job-1", {"summary": "s"}, rows)
    with engine.begin() as conn:
        conn.execute(sa.update(JOBS).where(JOBS.c.job_id == "job-1").values(status="applied"))
    assert cite(uid) == "3f2a9c1e" and cite("t-17") == "t-17"
    assert recall.answer(engine, "inc-1", "3f2a9c1e").endswith("ERR-5012 on db-primary-2")
    assert "ERR-5012" not in recall.answer(engine, "inc-2", "3f2a9c1e")
    assert not recall.answer(engine, "inc-1", "77aa00bb").startswith("[77aa00bb] (tool)")


def test_recall_is_bounded(tmp_path):
    _, engine = archived(tmp_path)
    big = ToolMessage(id="t-big", content="ERR-9 " * 5_000, tool_call_id="c")
    create_job(engine, "job-3", "inc-1", 100)
    archive.store_record(
        engine, "job-3", {}, archive.rows_for("inc-1", "job-3", "s", [big], ["t-big"])
    )
    with engine.begin() as conn:
        conn.execute(sa.update(JOBS).where(JOBS.c.job_id == "job-3").values(status="applied"))
    first = recall.answer(engine, "inc-1", "t-big")
    assert len(first) <= archive.RECALL_MAX_CHARS + 200
    # issue 18: a long original is read page by page, from the offset the answer names
    assert 'recall("t-big", offset=4000) reads on' in first.splitlines()[0]
    pages, offset = [], 0
    while True:
        page = recall.answer(engine, "inc-1", "t-big", offset)
        header, _, text = page.partition("\n")
        pages.append(text)
        if "reads on" not in header:
            break
        offset = int(header.split("offset=")[1].split(")")[0])
    assert "".join(pages) == big.content  # every char, once, in order


def test_recall_reads_on_from_where_a_shortened_result_of_several_parts_was_cut(tmp_path):
    # a result of text and an image: the offset its shortened copy names is in the same
    # text recall reads (the image a placeholder in both), so reading on misses nothing
    from offpath.compaction.shorten import shorten

    _, engine = archived(tmp_path)
    lines = "\n".join(f"panel {k}: p99 {k * 7} ms on checkout-api" for k in range(400))
    image = {"type": "image", "base64": "iVBOR" * 5_000, "mime_type": "image/png"}
    shot = ToolMessage(
        id="t-shot", content=[image, {"type": "text", "text": lines}], tool_call_id="c-shot"
    )
    short = str(shorten(shot, 3_000).content)
    head = short.partition("\n[offpath: ")[0]
    offset = int(short.split('recall("t-shot", offset=')[1].split(")")[0])
    create_job(engine, "job-4", "inc-1", 100)
    archive.store_record(
        engine, "job-4", {}, archive.rows_for("inc-1", "job-4", "s", [shot], ["t-shot"])
    )
    with engine.begin() as conn:
        conn.execute(sa.update(JOBS).where(JOBS.c.job_id == "job-4").values(status="applied"))
    assert head.startswith("[image: ") and offset == len(head)
    whole = recall.answer(engine, "inc-1", "t-shot").partition("\n")[2]
    assert whole.startswith(head)
    page = recall.answer(engine, "inc-1", "t-shot", offset).partition("\n")[2]
    assert (head + page).startswith(whole[: len(head) + 100])  # reads on where it was cut
    # a JSON payload is read as its JSON (it was a placeholder: found by nothing, read as
    # nothing), by its id and by the words in it
    rows = [{"pod": f"checkout-{k}", "error": "ERR-417" if k == 300 else None} for k in range(600)]
    payload = ToolMessage(
        id="t-json", content=[{"type": "json", "json": {"rows": rows}}], tool_call_id="c-json"
    )
    record = '"pod":"checkout-300","error":"ERR-417"'
    short = str(shorten(payload, 3_000).content)
    assert record not in short and "`ERR-417`" in short  # its record cut, the fact listed
    create_job(engine, "job-5", "inc-1", 100)
    archive.store_record(
        engine, "job-5", {}, archive.rows_for("inc-1", "job-5", "s", [payload], ["t-json"])
    )
    with engine.begin() as conn:
        conn.execute(sa.update(JOBS).where(JOBS.c.job_id == "job-5").values(status="applied"))
    assert recall.answer(engine, "inc-1", "ERR-417").startswith("[t-json] (tool)")
    read = "".join(
        recall.answer(engine, "inc-1", "t-json", at).partition("\n")[2]
        for at in range(0, 40_000, archive.RECALL_MAX_CHARS)
    )
    assert record in read


def test_agent_has_recall_and_reads_its_own_thread(tmp_path):
    settings, engine = archived(tmp_path)
    model = ToolModel(
        messages=iter(
            [
                AIMessage(
                    content="",
                    tool_calls=[{"id": "r1", "name": "recall", "args": {"query": "ERR-5012"}}],
                ),
                AIMessage(content="It was ERR-5012."),
            ]
        )
    )
    middleware = OffPathCompaction(settings)
    assert [t.name for t in middleware.tools] == ["recall"]
    agent = create_agent(model, [], middleware=[middleware], checkpointer=InMemorySaver())
    out = agent.invoke(
        {"messages": [HumanMessage("which error code?")]},
        {"configurable": {"thread_id": "inc-1"}},
    )
    answer = next(m for m in out["messages"] if m.type == "tool")
    assert answer.name == "recall" and "[t-17]" in answer.content
    assert OffPathCompaction(settings, recall=False).tools == []


def test_recall_outside_a_run_and_with_the_store_down_answers_in_text(tmp_path):
    tool = recall.recall_tool(lambda: make_engine(load_settings(data_dir=str(tmp_path))))
    assert "no thread_id" in tool.invoke({"query": "x"})
    broken = recall.recall_tool(lambda: (_ for _ in ()).throw(OSError("down")))
    model = ToolModel(
        messages=iter(
            [
                AIMessage(
                    content="", tool_calls=[{"id": "r", "name": "recall", "args": {"query": "a"}}]
                ),
                AIMessage(content="ok"),
            ]
        )
    )
    agent = create_agent(model, [broken], checkpointer=InMemorySaver())
    out = agent.invoke({"messages": [HumanMessage("q")]}, {"configurable": {"thread_id": "x"}})
    assert "could not be read (OSError)" in out["messages"][2].content


def test_reconciler_purges_the_archive_past_its_retention_once_an_hour(tmp_path):
    """``ARCHIVE_RETENTION_DAYS`` (issue 11, item 1): the reconciler deletes older originals,
    at most once per ``PURGE_EVERY_S`` (real Redis holds the mark)."""
    import uuid
    from datetime import UTC, datetime, timedelta

    from offpath.agent.graph import open_runtime
    from offpath.worker.reconciler import reconcile_once

    settings = load_settings(
        data_dir=str(tmp_path),
        archive_retention_days=7,
        redis_key_prefix=f"test-purge-{uuid.uuid4().hex[:8]}",
    )
    rt = open_runtime(settings)
    try:

        def add(job: str, age_days: int) -> None:
            create_job(rt.engine, job, "inc-9", 100)
            rows = archive.rows_for("inc-9", job, "s", [ORIGINAL], [ORIGINAL.id])
            rows[0]["created_at"] = datetime.now(UTC) - timedelta(days=age_days)
            archive.store_record(rt.engine, job, {}, rows)

        def jobs_archived() -> set[str]:
            with rt.engine.connect() as conn:
                return set(conn.execute(sa.select(archive.ARCHIVE.c.job_id)).scalars())

        add("old", 8)
        add("new", 6)
        done = reconcile_once(rt, lambda *a: None)
        assert done.get("archive_purged") == 1 and jobs_archived() == {"new"}
        add("old-2", 30)
        reconcile_once(rt, lambda *a: None)  # within the hour: not again
        assert jobs_archived() == {"new", "old-2"}
    finally:
        rt.close()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    """A migrated archive on each backend (real SQLite, real PostgreSQL)."""
    yield from migrated_engine(tmp_path, request.param)


def archive_in_turn(engine, thread: str, *messages) -> None:
    """Each of ``messages`` removed by a compaction of its own that applied, in order."""
    for k, message in enumerate(messages):
        job = f"{thread}-job-{k}"
        create_job(engine, job, thread, 100)
        rows = archive.rows_for(thread, job, f"s-{k}", [message], [message.id])
        archive.store_record(engine, job, {"summary": "s"}, rows)
        with engine.begin() as conn:
            conn.execute(sa.update(JOBS).where(JOBS.c.job_id == job).values(status="applied"))


def ids_in_order(answer: str) -> list[str]:
    return [line.split("]")[0][1:] for line in answer.split("\n\n")]


def test_recall_ranks_the_best_match_first_not_the_oldest(store):
    """The message that holds the most of the query's words comes first, whatever its age."""
    archive_in_turn(
        store,
        "inc-r",
        AIMessage(id="old", content="The ledger pods restarted overnight."),
        AIMessage(id="best", content="Ledger latency rose while the replica pool drained."),
        AIMessage(id="new", content="Checked the replica set; nothing else."),
    )
    answer = recall.answer(store, "inc-r", "ledger latency replica drained")
    assert ids_in_order(answer)[0] == "best", answer


def test_recall_answers_repeated_sentences_newest_first(store):
    """Messages that match the query alike (a loop of the same steps) come newest first."""
    loops = [
        AIMessage(
            id=f"loop-{k}", content=f"Memory of the worker settled at {k}40 Mi after the fix."
        )
        for k in range(1, 5)
    ]
    archive_in_turn(store, "inc-l", *loops)
    answer = recall.answer(store, "inc-l", "memory worker settled fix")
    named = re.findall(r"\[(loop-\d)\]", answer)  # the answer's, then the ones folded in
    assert named == ["loop-4", "loop-3", "loop-2", "loop-1"], answer


def test_recall_excerpt_of_a_long_message_holds_the_matched_words_around_the_fact(store):
    """The excerpt of a long message is taken where the query's words are, all of them with
    the fact between them, not the message's start nor a few words of the best fragment."""
    filler = "The dashboards were reviewed again with no new signal in them. " * 40
    said = (
        "After comparing the two rollouts across every region and each of the canary hosts, "
        "the checkout service memory ceiling came out between 867-918m on the nodes we "
        "sampled, which matches what the earlier heap profile of the service suggested."
    )
    long = AIMessage(id="long", content=filler + said + " " + filler)
    archive_in_turn(store, "inc-x", long)
    answer = recall.answer(store, "inc-x", "comparing rollouts canary checkout heap profile")
    excerpt = answer.split(") ", 1)[1]
    assert "867-918m" in excerpt, answer
    for word in ("comparing", "rollouts", "canary", "checkout", "heap", "profile"):
        assert f"[{word}]" in excerpt, (word, answer)
    assert len(excerpt) <= EXCERPT_MAX_CHARS + 2 * 6 + 6


def test_recall_folds_messages_alike_into_one_answer_that_names_each_ones_values(store):
    """A session that repeats its steps archives the same sentence with other values: one
    answer holds the newest in full and what each older one says differently, so the values
    of every repetition are in reach, and another match still has its own answer."""
    files = ["reproduce_bug.py", "pesfovoba_zap.py", "nosdifaju_boj.py", "bohhagumi_gav.py"]
    loops = [
        AIMessage(
            id=f"loop-{k}",
            content=(
                f"Now paste the example code from the issue into the `{name}` file to "
                f"replicate the bug; it raises at line {290 + k} of the handler."
            ),
        )
        for k, name in enumerate(files)
    ]
    other = AIMessage(id="other", content="The handler raises no bug once the example is fixed.")
    archive_in_turn(store, "inc-f", other, *loops)
    answer = recall.answer(store, "inc-f", "paste example issue replicate handler")
    first, *rest = answer.split("\n\n")
    assert first.startswith("[loop-3] (ai)"), answer
    for k, name in enumerate(files):
        assert name in first and f"line {290 + k}" in first, (name, answer)
    for k in range(3):
        assert f"loop-{k}" in first
    assert [block.split("]")[0] for block in rest] == ["[other"], answer
