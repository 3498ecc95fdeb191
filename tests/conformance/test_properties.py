"""The conformance properties on hand-made runs: each one passes a run that keeps it and
fails, naming the message, a run that breaks it (so that a pass in the suite means the
property held, not that the check could not fail). No processes."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from conformance.harness import Archived, Run, Thread
from conformance.properties import (
    bounded,
    caller_untouched,
    no_orphans,
    nothing_lost,
    one_summary,
    own_branch,
    whole_turns,
)
from offpath.compaction.summary import REQUEST_HEADING, SUMMARY_PREFIX

H0 = HumanMessage(id="h0", content="check the checkout pods")
A0 = AIMessage(id="a0", content="", tool_calls=[{"id": "c0", "name": "logs", "args": {}}])
T0 = ToolMessage(id="t0", content="pod api-1 p99 900 ms", tool_call_id="c0")
A1 = AIMessage(id="a1", content="api-1 is slow")
H1 = HumanMessage(id="h1", content="and the payments pods?")
A2 = AIMessage(id="a2", content="", tool_calls=[{"id": "c2", "name": "logs", "args": {}}])
T2 = ToolMessage(id="t2", content="pod pay-1 p99 80 ms", tool_call_id="c2")
A3 = AIMessage(id="a3", content="payments are fine")
H2 = HumanMessage(id="h2", content="thanks")
A4 = AIMessage(id="a4", content="you are welcome")
EVER = [H0, A0, T0, A1, H1, A2, T2, A3, H2, A4]


def summary(replaced: list[str], quote: str | None = None, id_: str | None = None) -> HumanMessage:
    text = f"{SUMMARY_PREFIX}\n\nwhat was done"
    if quote is not None:
        text += f"\n\n{REQUEST_HEADING}\n{quote}"
    return HumanMessage(
        id=id_ or replaced[0],
        content=text,
        additional_kwargs={
            "lc_source": "summarization",
            "summary": {"replaced_ids": replaced, "job_id": "job"},
        },
    )


def row(m: BaseMessage, session: str = "s", summary_id: str = "h0") -> Archived:
    return Archived(session, "job", summary_id, m)


def run_of(
    final: list[BaseMessage],
    archived: list[Archived] = (),  # type: ignore[assignment]
    ever: list[BaseMessage] = EVER,
    **kw: Any,
) -> Run:
    thread = Thread(
        ns="",
        ever=[*ever, *(m for m in final if m not in ever)],
        final=final,
        leaves=[final],
        states=[final],
        lineage={str(m.id) for m in ever},
    )
    rows: dict[str, list[Archived]] = {}
    for r in archived:
        rows.setdefault(str(r.message.id), []).append(r)
    fields: dict[str, Any] = {"produced": [], "returned": [], "calls": {}, **kw}
    return Run(
        shape="hand-made",
        thread_id="s",
        threads={"": thread},
        archived=rows,
        hard_limit=1_000,
        **fields,
    )


def fails(prop: Any, run: Run, *names: str) -> None:
    with pytest.raises(AssertionError) as err:
        prop(run)
    for name in names:
        assert name in str(err.value), err.value


COMPACTED = [summary(["h0", "a0", "t0", "a1"]), H1, A2, T2, A3, H2, A4]
ARCHIVED = [row(m) for m in (H0, A0, T0, A1)]


def test_nothing_lost() -> None:
    nothing_lost(run_of(EVER))
    nothing_lost(run_of(COMPACTED, ARCHIVED))
    fails(nothing_lost, run_of(COMPACTED, ARCHIVED[1:]), "human h0")
    changed = ToolMessage(id="t0", content="pod api-1 p99 901 ms", tool_call_id="c0")
    fails(nothing_lost, run_of(COMPACTED, [*ARCHIVED[:2], row(changed), ARCHIVED[3]]), "tool t0")
    short = T0.model_copy(
        update={"content": "pod api-1", "additional_kwargs": {"offpath_shortened": {}}}
    )
    nothing_lost(run_of([H0, A0, short, *EVER[3:]], [row(T0)]))
    fails(nothing_lost, run_of([H0, A0, short, *EVER[3:]]), "tool t0")
    reply = AIMessage(id="never", content="lost on the way")
    fails(nothing_lost, run_of(EVER, produced=[reply]), "never reached the thread")
    result = ToolMessage(content="what the tool said", tool_call_id="c9")
    fails(nothing_lost, run_of(EVER, returned=[result]), "c9")
    # a reply and a result no checkpoint held (durability="exit"), archived whole
    kept = ToolMessage(id="t9", content="what the tool said", tool_call_id="c9")
    inside = run_of(EVER, [row(reply), row(kept)], produced=[reply], returned=[result])
    nothing_lost(inside)
    changed = reply.model_copy(update={"content": "lost on the way, edited"})
    fails(nothing_lost, run_of(EVER, [row(changed)], produced=[reply]), "never reached")
    # a version the application removed or replaced itself is not offpath's to keep
    fails(nothing_lost, run_of([H0, A0, *EVER[3:]]), "tool t0")
    nothing_lost(run_of([H0, A0, *EVER[3:]], dropped={("t0", repr(("tool", T0.content)))}))
    # a graph's input written before it had its id is the message with its id
    unnamed = HumanMessage(content=H0.content)
    nothing_lost(run_of(EVER, ever=[unnamed, *EVER]))
    fails(nothing_lost, run_of(EVER, ever=[HumanMessage(content="other"), *EVER]), "human None")


def test_no_orphans() -> None:
    no_orphans(run_of(EVER))
    fails(no_orphans, run_of([H0, A0, A1]), "call:a0:c0")
    fails(no_orphans, run_of([H0, T0, A1]), "result:t0")
    waiting = run_of([H0, A0])
    waiting.root.interrupted = True
    no_orphans(waiting)
    # a subgraph whose call's result was handed to its parent (Command(graph=PARENT))
    handed = run_of(EVER)
    sub = Thread("sub:1", [H0, A0], [H0, A0], [[H0, A0]], [[H0, A0]], {"h0", "a0"})
    handed.threads["sub:1"] = sub
    no_orphans(handed)
    dropped = run_of(EVER)
    held = [H0, A0, T0]
    dropped.threads["sub:1"] = Thread("sub:1", held, [H0, A0], [[H0, A0]], [held], {"h0"})
    fails(no_orphans, dropped, "call:a0:c0")  # its result was there, and is gone


def test_whole_turns_reads_a_request_of_content_blocks() -> None:
    """A request whose content is a list of blocks is quoted by its text (an image by a
    placeholder line): the quote stands for it; another text does not."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    h0 = HumanMessage(id="h0", content=[{"type": "text", "text": "check the pods"}, image])
    ever = [h0, *EVER[1:]]
    quoted = summary(["h0"], quote="check the pods\n[image_url: 26 chars not shown]")
    whole_turns(run_of([quoted, *EVER[1:]], ever=ever))
    other = summary(["h0"], quote="check the nodes")
    fails(whole_turns, run_of([other, *EVER[1:]], ever=ever), "neither kept, copied nor quoted")


def test_whole_turns() -> None:
    whole_turns(run_of(COMPACTED))
    # a request kept with its answer removed
    fails(whole_turns, run_of([summary(["a0", "t0", "a1"]), H0, H1, A2, T2, A3]), "request h0 kept")
    # an answer kept, its request removed, neither copied nor quoted
    orphaned = [summary(["h1", "a2", "t2"]), A3, H2, A4]
    fails(whole_turns, run_of(orphaned), "of request h1 kept")
    whole_turns(run_of([summary(["h1", "a2", "t2"], quote=H1.content), A3, H2, A4]))
    copy = HumanMessage(id="a2", content=H1.content, additional_kwargs={"offpath_request_of": "h1"})
    whole_turns(run_of([summary(["h1", "a2", "t2"]), copy, A3, H2, A4]))
    # the last turn may be cut anywhere
    whole_turns(run_of([summary([*map(str, (m.id for m in EVER[:8])), "h2"]), A4]))


def test_caller_untouched() -> None:
    before = [H0, A0, T0]
    ours = summary(["h0", "a0", "t0", "a1"])
    caller = {"callee_tools": frozenset({"delegate"}), "caller_before": before}
    caller_untouched(run_of(EVER, **caller))
    caller_untouched(run_of([ours, *EVER[4:]], ARCHIVED, **caller))
    # a later compaction of the caller folds the first one's summary (which keeps its id)
    folded = summary(["h0", "h1", "a2", "t2"])
    history = [*EVER, ours, folded]
    caller_untouched(run_of([folded, *EVER[7:]], ARCHIVED, ever=history, **caller))
    # archived by a compaction the caller never had in its thread
    theirs = [row(m, summary_id="sub-summary") for m in (H0, A0, T0, A1)]
    fails(caller_untouched, run_of(EVER[4:], theirs, **caller), "human h0")
    # archived under another session
    elsewhere = [row(m, session="sub") for m in (H0, A0, T0, A1)]
    fails(caller_untouched, run_of([ours, *EVER[4:]], elsewhere, **caller), "human h0")


def test_bounded() -> None:
    bounded(run_of(EVER, calls={"agent": [EVER]}))
    big = HumanMessage(id="big", content="x" * 1_001)
    fails(bounded, run_of(EVER, calls={"agent": [EVER, [big]]}), "agent call 1")


def test_one_summary() -> None:
    one_summary(run_of(COMPACTED))
    two = [summary(["h0"]), summary(["h1"]), A4]
    fails(one_summary, run_of(two), "summaries ['h0', 'h1']")
    fails(one_summary, run_of(EVER, calls={"agent": [two]}), "agent call 0")


def test_own_branch() -> None:
    own_branch(run_of(COMPACTED))
    other = [summary(["h0", "x9"]), *EVER[1:]]
    # x9 was held on another branch (a checkpoint off the final one's parent chain)
    x9 = AIMessage(id="x9", content="on the other branch")
    forked = run_of(other)
    forked.threads[""].ever.append(x9)
    fails(own_branch, forked, "x9")
    # an id no checkpoint held (a message that lived only in a run with durability="exit")
    own_branch(run_of(other))
    # a node sharing its parent's messages starts with the parent's summary
    shared = run_of(COMPACTED)
    start = [summary(["h0", "a0"]), *EVER[2:]]
    shared.threads["agent:2"] = Thread("agent:2", start, start, [start], [start], {"t0"})
    own_branch(shared)
    # one it made itself, of a message another branch held
    shared.root.ever.append(x9)
    made = summary(["h0", "x9"], id_="h0")
    made.content = f"{made.content} (made here)"
    shared.threads["agent:2"].final = [made, *EVER[2:]]
    fails(own_branch, shared, "x9")
    fails(own_branch, run_of(COMPACTED, other_branch={"job"}), "prepared on another branch")
