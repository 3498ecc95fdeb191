"""The properties every shape keeps, checked on a finished :class:`~.harness.Run` (issue 30,
item 3; DESIGN.md invariants 1, 3, 9, 12, 13, 17 and 18). Each raises ``AssertionError``
naming what broke it and the messages involved; :data:`PROPERTIES` lists them by name.

"The thread" is one checkpoint namespace of the run's thread: the root graph's, or a
subgraph's or a subagent's (an agent run from a tool has its own namespace). A message's
home is the namespace it first lived in that is closest to the root.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.messages import BaseMessage
from shared import pairing_problems, pending_calls

from conformance.harness import (
    REQUEST_COPY,
    Run,
    Thread,
    describe,
    is_request,
    is_request_copy,
    is_shortened,
    is_summary,
    job_of,
    offpath_made,
    replaced_ids,
    same,
)
from offpath.compaction.accounting import total_chars
from offpath.compaction.summary import summary_request

#: How many offending messages a failure message lists.
SHOWN = 8


def _fail(what: str, problems: list[str]) -> None:
    if problems:
        more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
        raise AssertionError(f"{what}: {len(problems)}{more}:\n  " + "\n  ".join(problems[:SHOWN]))


def _originals(messages: list[BaseMessage]) -> list[BaseMessage]:
    """The originals among ``messages``: not a version offpath made, not a system prompt, and
    not a graph's input before LangGraph gave it its id (the same message with its id is
    among them: a write of deepagents' ``task`` keeps the subagent's input without one)."""
    named = {(m.type, repr(m.content)) for m in messages if m.id is not None}
    return [
        m
        for m in messages
        if not offpath_made(m)
        and m.type != "system"
        and (m.id is not None or (m.type, repr(m.content)) not in named)
    ]


def _archived_whole(run: Run, m: BaseMessage, session: str | None = None) -> bool:
    return any(
        same(row.message, m) and (session is None or row.session_id == session)
        for row in run.archived.get(str(m.id), [])
    )


def homes(run: Run) -> dict[str, str]:
    """By message id: the namespace closest to the root in which an original of it lived."""
    homes: dict[str, str] = {}
    for ns in sorted(run.threads, key=lambda n: (n.count("|"), len(n), n)):
        for m in _originals(run.threads[ns].ever):
            homes.setdefault(str(m.id), ns)
    return homes


def nothing_lost(run: Run) -> None:
    """Every message that ever existed in the run's thread (in any checkpoint of any
    namespace and branch, pending writes included, and every reply the models returned and
    result the tools returned) is at the head of its home thread's branch byte for byte, or
    there shortened in place (marked ``offpath_shortened``) with its original in the
    archive, or in the archive byte for byte (DESIGN.md invariants 1 and 12); a reply or a
    result that no checkpoint ever held (a run with ``durability="exit"`` checkpoints only its
    end: what a compaction in the run removed never reached one) is in the archive. Versions
    offpath made (a summary, a request's copy, a shortened message) are derived, not
    originals: they are not required to stay; nor are the versions the application removed or
    replaced itself (``Run.dropped``)."""
    homes_ = homes(run)
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for thread in run.threads.values():
        for m in _originals(thread.ever):
            home = homes_[str(m.id)]
            key = (str(m.id), repr((m.type, m.content)))
            if home != thread.ns or key in seen or key in run.dropped:
                continue
            seen.add(key)
            if _kept_or_archived(run, run.threads[home], m):
                continue
            where = f" (namespace {home!r})" if home else ""
            problems.append(f"{describe(m)}{where}")
    ever = [m for t in run.threads.values() for m in t.ever]
    ids = {m.id for m in ever}
    archived = [row.message for rows in run.archived.values() for row in rows]
    for reply in run.produced:
        if reply.id not in ids and not _archived_whole(run, reply):
            problems.append(f"model reply {describe(reply)}: never reached the thread")
    for result in run.returned:
        if not any(
            m.type == "tool"
            and m.tool_call_id == result.tool_call_id
            and m.content == result.content
            for m in [*ever, *archived]
        ):
            problems.append(f"result of call {result.tool_call_id}: never reached the thread")
    _fail("messages in neither the thread nor the archive", problems)


def _kept_or_archived(run: Run, thread: Thread, m: BaseMessage) -> bool:
    for leaf in thread.leaves:
        now = next((x for x in leaf if x.id == m.id and x.type == m.type), None)
        if now is not None and same(now, m):
            return True
        if now is not None and is_shortened(now) and _archived_whole(run, m):
            return True
    return _archived_whole(run, m)


def no_orphans(run: Run) -> None:
    """In every thread's final state, no tool result lacks its call and no call lacks its
    result (DESIGN.md invariant 3); a call left open by an interrupt the run still waits on
    is allowed, and so is, in a subgraph's namespace, a call whose result that namespace never
    held and another one did (a handoff tool's ``Command(graph=Command.PARENT)`` writes its
    result to the parent only: LangGraph leaves the subgraph's last checkpoint so)."""
    problems: list[str] = []
    results = {
        ns: {str(m.tool_call_id) for m in t.ever if m.type == "tool"}
        for ns, t in run.threads.items()
    }
    for thread in run.threads.values():
        found = pairing_problems(thread.final)
        if thread.interrupted:
            found -= pending_calls(thread.final)
        if thread.ns:
            elsewhere = set().union(*(r for ns, r in results.items() if ns != thread.ns))
            handed = elsewhere - results[thread.ns]
            found = {p for p in found if not (p.startswith("call:") and p.split(":")[-1] in handed)}
        where = f"namespace {thread.ns!r}: " if thread.ns else ""
        problems += [f"{where}{p}" for p in sorted(found)]
    _fail("orphan calls or results in the final thread", problems)


def turns_of(messages: list[BaseMessage]) -> list[list[BaseMessage]]:
    """``messages`` (originals, in order) cut into turns: a request (a human message that
    is neither a summary nor a request's copy) and the model's and tools' messages after it,
    up to the next request. Messages before the first request belong to no turn."""
    turns: list[list[BaseMessage]] = []
    for m in messages:
        if is_request(m):
            turns.append([m])
        elif turns and m.type in ("ai", "tool"):
            turns[-1].append(m)
    return turns


def _quoted_in(request: BaseMessage, quoted: set[str]) -> bool:
    """A summary quotes ``request``: its text exactly; for content as a list of blocks, its
    text blocks joined by newlines, then (a line each) whatever stands for its other blocks
    (an image is quoted by a placeholder, never its payload)."""
    content = request.content
    if isinstance(content, str):
        return content.strip() in quoted
    text = "\n".join(
        str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"
    ).strip()
    return bool(text) and any(q == text or q.startswith(f"{text}\n") for q in quoted)


def whole_turns(run: Run) -> None:
    """Turns stay whole (DESIGN.md invariant 17). The messages ever in each thread are cut
    into turns (:func:`turns_of`); for every turn except the thread's last one (the turn in
    progress may be cut anywhere):

    * if its request is kept in place, its final answer (its last model message) is kept
      in place too: a request never stays with its answer gone;
    * if any of its answer messages (the model's messages and tool results) is kept in
      place, its request is kept: in place, as a copy (a human message whose
      ``additional_kwargs`` has ``offpath_request_of`` naming it), or quoted by the thread's
      summary (:func:`~offpath.compaction.summary.summary_request`): an answer never stays
      without its question.

    "Kept in place": the final thread holds a message of that id and type that is not a
    summary nor a copy (shortened in place counts as kept)."""
    problems: list[str] = []
    for thread in run.threads.values():
        final = {m.id: m for m in thread.final}

        def kept(m: BaseMessage, final: dict[Any, BaseMessage] = final) -> bool:
            now = final.get(m.id)
            return (
                now is not None
                and now.type == m.type
                and not is_summary(now)
                and not is_request_copy(now)
            )

        copies = {m.additional_kwargs.get(REQUEST_COPY) for m in thread.final if m.type == "human"}
        quoted = {(summary_request(m) or "").strip() for m in thread.final if is_summary(m)} - {""}
        where = f"namespace {thread.ns!r}: " if thread.ns else ""
        for turn in turns_of(_originals(thread.ever))[:-1]:
            request, answer = turn[0], turn[1:]
            replies = [m for m in answer if m.type == "ai"]
            if kept(request) and replies and not kept(replies[-1]):
                problems.append(
                    f"{where}request {request.id} kept, its answer {replies[-1].id} removed"
                )
            held = [m for m in answer if kept(m)]
            if held and not (kept(request) or request.id in copies or _quoted_in(request, quoted)):
                problems.append(
                    f"{where}{len(held)} answer message(s) of request {request.id} kept "
                    f"({', '.join(str(m.id) for m in held[:3])}), the request neither kept, "
                    "copied nor quoted"
                )
    _fail("turns split by a compaction", problems)


def caller_untouched(run: Run) -> None:
    """A callee never writes its caller's state (DESIGN.md invariant 18): every message of
    the caller's thread (the root agent's) that existed before a callee agent ran (at the
    checkpoints where the caller's last message calls a callee tool) is still in the
    caller's thread at the end (byte for byte, or shortened in place with its original
    archived), or archived under the caller's own session by a compaction of the caller
    (a summary that was in the caller's thread and replaced it)."""
    if not run.callee_tools:
        raise AssertionError(f"{run.shape} has no caller and callee")
    if not run.caller_before:
        raise AssertionError(f"{run.shape}: no checkpoint of the caller before a callee ran")
    final = {m.id: m for m in run.root.final}
    by_caller: dict[str, set[str]] = {}  # a summary's id -> what the summaries of that id replaced
    for s in (m for m in run.root.ever if is_summary(m)):
        by_caller.setdefault(str(s.id), set()).update(replaced_ids(s))
    problems: list[str] = []
    seen: set[str] = set()
    for m in _originals(run.caller_before):
        if str(m.id) in seen:
            continue
        seen.add(str(m.id))
        now = final.get(m.id)
        if now is not None and now.type == m.type:
            if same(now, m) or (is_shortened(now) and _archived_whole(run, m, run.thread_id)):
                continue
        if any(
            row.session_id == run.thread_id
            and same(row.message, m)
            and str(m.id) in by_caller.get(row.summary_id, set())
            for row in run.archived.get(str(m.id), [])
        ):
            continue
        problems.append(describe(m))
    _fail("caller's messages gone from its thread and not archived by its own compaction", problems)


def bounded(run: Run) -> None:
    """No model call's input, the system prompt included, is over the hard limit
    (``CONTEXT_HARD_LIMIT_CHARS``; DESIGN.md invariants 9 and 13)."""
    problems = [
        f"{name} call {k}: {total_chars(sent):,} chars > {run.hard_limit:,}"
        for name, calls in run.calls.items()
        for k, sent in enumerate(calls)
        if total_chars(sent) > run.hard_limit
    ]
    _fail("model calls over the hard limit", problems)


def one_summary(run: Run) -> None:
    """At most one summary message in any thread: at every checkpoint of every namespace,
    and in every model call's input (DESIGN.md invariant 2)."""
    problems: list[str] = []
    for thread in run.threads.values():
        for k, state in enumerate(thread.states):
            ids = [str(m.id) for m in state if is_summary(m)]
            if len(ids) > 1:
                problems.append(f"namespace {thread.ns!r} checkpoint {k}: summaries {ids}")
    for name, calls in run.calls.items():
        for k, sent in enumerate(calls):
            ids = [str(m.id) for m in sent if is_summary(m)]
            if len(ids) > 1:
                problems.append(f"{name} call {k}: summaries {ids}")
    _fail("threads with more than one summary", problems)


def nested(ns: str, inner: str) -> bool:
    """``inner`` is a namespace nested in ``ns`` (every other one is nested in the root's)."""
    return inner != ns and (ns == "" or inner.startswith(f"{ns}|"))


def own_branch(run: Run) -> None:
    """A summary replaces only messages of its own branch: every id it names as replaced
    was on its thread's final checkpoint's parent chain, or in a namespace nested in that
    thread's (a subgraph's own steps, which an agent added as a node hands to its parent
    compacted). A summary a subgraph's thread was given at its start (a node sharing its
    parent's messages starts with the parent's thread) is checked where it was made. A compaction prepared on another branch (before a time travel or a fork) is
    never applied here: no summary in a final thread is the work of a job prepared on
    another branch (``Run.other_branch``). An id no checkpoint of the run held (a message
    that lived only inside a run with ``durability="exit"``) is on no other branch."""
    problems: list[str] = []
    checkpointed = {str(m.id) for t in run.threads.values() for m in t.ever}
    for thread in run.threads.values():
        allowed = set(thread.lineage)
        for ns, inner in run.threads.items():
            if nested(thread.ns, ns):
                allowed |= {str(m.id) for m in inner.ever}
        # a node sharing its parent's messages starts with the parent's thread: a summary it
        # was given is checked where it was made
        first = next((state for state in thread.states if state), [])
        given = {(m.id, repr(m.content)) for m in first if is_summary(m)} if thread.ns else set()
        for s in (m for m in thread.final if is_summary(m)):
            if (s.id, repr(s.content)) in given:
                continue
            if job_of(s) in run.other_branch:
                problems.append(f"summary {s.id} is job {job_of(s)}'s, prepared on another branch")
            # a message no checkpoint held (``durability="exit"``) is no other branch's
            foreign = [i for i in replaced_ids(s) if i not in allowed and i in checkpointed]
            if foreign:
                where = f"namespace {thread.ns!r}: " if thread.ns else ""
                problems.append(
                    f"{where}summary {s.id} replaced {len(foreign)} message(s) this branch "
                    f"never held: {foreign[:4]}"
                )
    _fail("summaries of another branch", problems)


def own_compactions(run: Run, thread: Thread) -> set[str]:
    """The applied compactions of ``thread`` itself: jobs of the summaries it held that
    replaced a message whose home it is (:func:`homes`; a callee's summary handed to its
    caller replaced only the callee's messages, so it is not the caller's)."""
    home = homes(run)
    return {
        str(job)
        for s in thread.ever
        if is_summary(s)
        and (job := job_of(s)) in run.applied
        and any(home.get(i) == thread.ns for i in replaced_ids(s))
    }


def held_compactions(run: Run, thread: Thread) -> set[str]:
    """The applied compactions of the messages ``thread`` held: jobs of the summaries it held
    that replaced a message it held. A callee's, whatever the messages' home (a fanned run
    hands its caller its messages whole at its end: their home is then the caller's)."""
    held = {str(m.id) for m in thread.ever}
    return {
        str(job)
        for s in thread.ever
        if is_summary(s)
        and (job := job_of(s)) in run.applied
        and any(i in held and i != str(s.id) for i in replaced_ids(s))
    }


#: The properties by name, in the order the report shows them.
PROPERTIES: dict[str, Callable[[Run], None]] = {
    "nothing_lost": nothing_lost,
    "no_orphans": no_orphans,
    "whole_turns": whole_turns,
    "caller_untouched": caller_untouched,
    "bounded": bounded,
    "one_summary": one_summary,
    "own_branch": own_branch,
}
