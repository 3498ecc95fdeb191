"""Archive rows as :func:`offpath.stores.archive.insert_rows` writes them: on PostgreSQL all of
a job's rows as one JSON parameter, read back exactly as the row-by-row insert writes them
(values, order, search), and a value the database refuses still named."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from stack import migrated_engine

from offpath.stores import archive
from offpath.stores.db.tables import JOBS
from offpath.stores.db.transitions import create_job
from offpath.stores.search import search
from offpath.stores.values import Unstorable


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request, tmp_path):
    yield from migrated_engine(tmp_path, request.param)


@pytest.fixture
def pg_engine(tmp_path):
    yield from migrated_engine(tmp_path, "postgres")


def thread() -> list[Any]:
    """Messages with what JSON and text columns must carry whole: quotes, backslashes,
    newlines, tabs, non-ASCII, emoji, numbers, nested tool calls, empty content."""
    return [
        SystemMessage(id="sys", content="You are an SRE assistant."),
        HumanMessage(id="h1", content='why does "checkout" 502?\n\tsince 10:30 UTC — ünïcode 🚒'),
        AIMessage(
            id="a1",
            content="",
            tool_calls=[
                {"id": "c1", "name": "kubectl_logs", "args": {"pod": "web-x\\1", "n": 3.5}},
                {"id": "c2", "name": "grep", "args": {"pattern": "ERR-5012", "flags": [1, None]}},
            ],
        ),
        ToolMessage(id="t1", content="ERR-5012 at db-primary-2\n" * 40, tool_call_id="c1"),
        ToolMessage(id="t2", content=[{"type": "text", "text": "part"}], tool_call_id="c2"),
        HumanMessage(id="h2", content="kept"),
    ]


def stored(engine, job_id: str) -> list[tuple[Any, ...]]:
    cols = [c for c in archive.ARCHIVE.c if c.name not in ("id", "job_id", "tsv")]
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.select(*cols)
                .where(archive.ARCHIVE.c.job_id == job_id)
                .order_by(archive.ARCHIVE.c.id)
            )
        ]


def test_rows_read_back_as_the_row_by_row_insert_writes_them(engine):
    messages = thread()
    removed, shortened = ["h1", "a1", "t2", "t1"], ["h2"]
    for job in ("one-statement", "row-by-row"):
        create_job(engine, job, "s-1", 100)
    rows = archive.rows_for("s-1", "one-statement", "h1", messages, removed, shortened)
    with engine.begin() as conn:
        archive.insert_rows(conn, rows)
        conn.execute(
            sa.insert(archive.ARCHIVE),
            archive.rows_for("s-1", "row-by-row", "h1", messages, removed, shortened),
        )
    one, each = stored(engine, "one-statement"), stored(engine, "row-by-row")
    # in thread order, every value as given (created_at aside: one clock read per call)
    assert [r[3] for r in one] == ["h1", "a1", "t1", "t2", "h2"]
    assert [r[:-2] + r[-1:] for r in one] == [r[:-2] + r[-1:] for r in each]
    assert [r[4] for r in one] == [row["message"] for row in rows]
    assert [r[-2].replace(tzinfo=None) for r in one] == [
        row["created_at"].replace(tzinfo=None) for row in rows
    ]


def test_a_compactions_rows_are_searchable_as_before(engine):
    create_job(engine, "job-1", "s-1", 100)
    rows = archive.rows_for("s-1", "job-1", "h1", thread(), ["h1", "a1", "t1"])
    archive.store_record(engine, "job-1", {"summary": "s"}, rows)
    with engine.begin() as conn:
        conn.execute(sa.update(JOBS).where(JOBS.c.job_id == "job-1").values(status="applied"))
    found = search(engine, "s-1", "ERR-5012")
    assert [f["message_id"] for f in found] == ["t1", "a1"], found
    assert archive.original(engine, "s-1", "a1") == rows[1]["message"]


def test_a_nul_in_a_removed_message_is_refused_and_named(pg_engine):
    engine = pg_engine  # PostgreSQL's text and jsonb refuse it (SQLite keeps it)
    create_job(engine, "job-1", "s-1", 100)
    bad = ToolMessage(id="t-nul", content="ok\x00then", tool_call_id="c1")
    rows = archive.rows_for("s-1", "job-1", "h1", [*thread(), bad], ["h1", "t-nul"])
    with pytest.raises(Unstorable, match='message "t-nul"'):
        archive.store_record(engine, "job-1", {"summary": "s"}, rows)
    assert stored(engine, "job-1") == []  # nothing of the job written


def test_rows_of_other_shapes_are_written_row_by_row_as_before(pg_engine):
    create_job(pg_engine, "job-1", "s-1", 100)
    rows = archive.rows_for("s-1", "job-1", "h1", thread(), ["h1", "a1"])
    for row in rows:
        del row["kind"]  # the column's default
    with pg_engine.begin() as conn:
        archive.insert_rows(conn, rows)
    got = stored(pg_engine, "job-1")
    assert [(r[3], r[-1]) for r in got] == [("h1", archive.REMOVED), ("a1", archive.REMOVED)]


def test_originals_are_read_by_id_in_one_query_the_first_row_of_each(engine):
    """``archive.originals``: each message's first archived row (a result shortened as it
    arrived, then removed by a compaction, is read as it first was), the ids not archived
    and the rows of a job never applied left out."""
    messages = thread()
    archive.store_shortened(engine, "s-1", [(3, messages[3])])
    create_job(engine, "job-1", "s-1", 100)
    later = [*messages[:3], ToolMessage(id="t1", content="shortened", tool_call_id="c1")]
    rows = archive.rows_for("s-1", "job-1", "h1", later, ["h1", "a1", "t1"])
    archive.store_record(engine, "job-1", {"summary": "s"}, rows)
    create_job(engine, "job-2", "s-1", 100)  # never applied
    archive.store_record(
        engine, "job-2", {"summary": "s"}, archive.rows_for("s-1", "job-2", "t2", messages, ["t2"])
    )
    assert archive.originals(engine, "s-1", ["t1", "a1", "nope", "t2"]) == {"t1": messages[3]}
    with engine.begin() as conn:
        conn.execute(sa.update(JOBS).where(JOBS.c.job_id == "job-1").values(status="applied"))
    found = archive.originals(engine, "s-1", ["t1", "a1", "nope", "t2", "t1"])
    assert found == {"t1": messages[3], "a1": messages[2]}
    assert (
        archive.originals(engine, "s-2", ["t1"]) == {}
        and archive.originals(engine, "s-1", []) == {}
    )


def steps(first: int, last: int, fill: str) -> list[Any]:
    """Tool-call steps ``first`` to ``last`` (excluded): a call and its 1,500-char result."""
    out: list[Any] = []
    for i in range(first, last):
        call = {"id": f"c{i}", "name": "bash", "args": {"n": i}}
        out += [
            AIMessage(id=f"a{i}", content=f"step {i}", tool_calls=[call]),
            ToolMessage(id=f"t{i}", content=fill * 1_500, tool_call_id=f"c{i}"),
        ]
    return out


def test_a_request_copys_original_is_the_request_not_the_message_whose_id_it_took(engine):
    """A long request kept as a shortened copy after the summary takes the id of the message
    the cut removed second, whose own original is archived first under that id: reading the
    copy's original gives the request (under the request's id, its digest checked), and a
    shortened message whose id's first row says something else gives nothing."""
    from functools import partial

    from langgraph.graph.message import add_messages

    from offpath.compaction.patch import Stale, fit_now
    from offpath.compaction.pipeline import compact, prepare
    from offpath.compaction.planner import CompactionPlan, plan_compaction
    from offpath.compaction.shorten import MARK, is_shortened, originals_of, shorten
    from offpath.compaction.summarizers.offline import OfflineSummarizer
    from offpath.compaction.summary import REQUEST_COPY
    from offpath.config import load_settings
    from offpath.llm import make_summarizer as guarded

    settings = load_settings(summarization_threshold_chars=30_000, summarization_keep_chars=10_000)
    request = HumanMessage(
        id="req", content="Fix the reconciliation job: `ledger_sync` fails. " + "ctx " * 5_000
    )
    thread: list[Any] = [SystemMessage(id="sys", content="sys"), request, *steps(0, 30, "z")]
    outcome = compact(thread, settings, OfflineSummarizer())
    plan = outcome.plan
    assert plan.request_copy == "req", plan
    after = add_messages(thread, outcome.patch)
    copy = next(m for m in after if m.additional_kwargs.get(REQUEST_COPY) == "req")
    assert copy.id == plan.removed[1].id and is_shortened(copy)  # the id it took
    create_job(engine, "job-1", "s-1", 100)
    rows = archive.rows_for("s-1", "job-1", "req", thread, [m.id for m in plan.removed])
    archive.store_record(engine, "job-1", {"summary": "s"}, rows)
    with engine.begin() as conn:
        conn.execute(sa.update(JOBS).where(JOBS.c.job_id == "job-1").values(status="applied"))
    read = partial(archive.originals, engine, "s-1")
    assert read([copy.id])[copy.id].type == "ai"  # the first row under the copy's id
    found = originals_of(after, read)
    assert found[copy.id].content == request.content and found[copy.id].type == "human"
    assert found[copy.id].id == copy.id  # in the thread's place of the copy
    for short in (copy, shorten(copy, 600)):  # shortened again in place, the note is the same
        assert f'recall("{plan.request_copy}"' in short.content, short.content
    cited = archive.original(engine, "s-1", plan.request_copy)
    assert cited is not None and cited["data"]["content"] == request.content
    # a later compaction removes the copy: it reads the request, and cites it by the
    # request's id, the one whose first row recall reads
    more: list[Any] = [AIMessage(id="done", content="Fixed: `ledger_sync` retries now.")]
    more.append(HumanMessage(id="req2", content="Now check the billing job."))  # a new turn
    more += steps(30, 60, "y")
    grown = add_messages(after, more)
    plan2 = plan_compaction(grown, settings)
    assert isinstance(plan2, CompactionPlan) and copy.id in {m.id for m in plan2.removed}
    back = originals_of(plan2.removed, read)
    read2 = dataclasses.replace(plan2, removed=tuple(back.get(m.id, m) for m in plan2.removed))
    done = prepare(plan2, settings, guarded(settings), job_id="job-2", read=read2)
    fitted = fit_now(done.prepared, grown, settings, force=True, originals=read)
    assert not isinstance(fitted, Stale), fitted
    text = str(fitted.patch[0].content)
    cited = re.findall(r'recall\("([^"]+)"|\(([^()\s;]+)[;)]| from (\S+):', text)
    ids = {i for groups in cited for i in groups if i}
    assert copy.id not in ids, text  # its first row is another message
    span = next(ln for ln in text.splitlines() if ln.startswith("- turn 2,"))
    assert f"messages from {plan.request_copy}:" in span, text  # the span the copy starts
    impostor = ToolMessage(  # shortened, its id's first row another message
        id=copy.id,
        content="short",
        tool_call_id="cx",
        additional_kwargs={MARK: {"chars": 9_000, "digest": "0" * 16}},
    )
    assert originals_of([impostor], read) == {}
