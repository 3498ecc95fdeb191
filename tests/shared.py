"""Access to ../shared (cases and transcripts) and test-side invariant checks.

The checks here are written independently of the product code on purpose: a
bug in ``compaction`` must not hide itself by also being in the checker.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage, convert_to_messages

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SHARED_DIR", ROOT.parent / "shared")).resolve()
CASES = sorted((SHARED / "cases").glob("*.json"))
TRANSCRIPTS = sorted((SHARED / "transcripts").glob("*.json"))

if not CASES or not TRANSCRIPTS:
    raise RuntimeError(
        f"../shared with cases/ and transcripts/ not found at {SHARED}: clone the project beside "
        "it, or set SHARED_DIR to its folder"
    )


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def messages_of(doc: dict[str, Any]) -> list[BaseMessage]:
    return convert_to_messages(doc["messages"])


def settings_of(doc: dict[str, Any]) -> dict[str, Any]:
    return {k.lower(): v for k, v in doc.get("settings", {}).items()}


# --- invariant checks (independent of compaction/) ------------------------------------


def marked_summary(m: BaseMessage) -> bool:
    return m.type == "human" and (
        m.additional_kwargs.get("lc_source") == "summarization"
        or m.additional_kwargs.get("summary") is True
    )


def _answer(waiting: list[tuple[str, str]], call_id: str) -> bool:
    """Take the nearest earlier unanswered call with ``call_id`` off ``waiting``."""
    for k in range(len(waiting) - 1, -1, -1):
        if waiting[k][1] == call_id:
            del waiting[k]
            return True
    return False


def pairing_problems(messages: Sequence[BaseMessage]) -> set[str]:
    """``result:<tool message id>`` for each result that answers no earlier unanswered call,
    ``call:<ai message id>:<call id>`` for each call never answered. A result answers the
    nearest earlier unanswered call with its id (call ids may repeat across responses)."""
    waiting: list[tuple[str, str]] = []
    problems: set[str] = set()
    for m in messages:
        if m.type == "tool" and not _answer(waiting, m.tool_call_id):
            problems.add(f"result:{m.id}")
        waiting += [(m.id, c["id"]) for c in getattr(m, "tool_calls", None) or []]
    return problems | {f"call:{mid}:{cid}" for mid, cid in waiting}


def pending_calls(messages: Sequence[BaseMessage]) -> set[str]:
    """``call:<ai message id>:<call id>`` of calls with no result and no turn (a human
    message that is not a summary) after them."""
    waiting: list[tuple[str, str]] = []
    for m in messages:
        if m.type == "human" and not marked_summary(m):
            waiting.clear()  # a new turn: earlier unanswered calls were abandoned, not pending
        if m.type == "tool":
            _answer(waiting, m.tool_call_id)
        waiting += [(m.id, c["id"]) for c in getattr(m, "tool_calls", None) or []]
    return {f"call:{mid}:{cid}" for mid, cid in waiting}


def turn_problems(messages: Sequence[BaseMessage], *, quoted_ok: bool = True) -> set[str]:
    """DESIGN.md invariant 17, read off a thread: ``unanswered:<request id>`` for a request
    (a human message that is not a summary) of a finished turn (a later request follows it)
    that has no AI message after it in its turn; ``headless:<message id>`` for an AI or tool
    message of a finished turn whose request is not in the thread. A summary that quotes the
    request of the turn it cut into (under its "Request of the turn ..." heading) stands
    for that request when ``quoted_ok``: the turn was in progress at that compaction, and later
    turns came after it (checking a thread long after its compactions); checking one compaction
    against the thread it was applied to, the turn it cuts into must be that thread's last.
    Calls still waiting for their results and the results they have stay wherever their turn
    went (invariant 14): not counted."""
    requests = [i for i, m in enumerate(messages) if m.type == "human" and not marked_summary(m)]
    if not requests:  # one turn, in progress
        return set()
    last = requests[-1]
    # open calls (no result anywhere after them) and the results of their AI messages
    waiting: list[tuple[str, str]] = []
    owner: dict[str, str] = {}
    for m in messages:
        if m.type == "tool":
            for k in range(len(waiting) - 1, -1, -1):
                if waiting[k][1] == m.tool_call_id:
                    owner[str(m.id)] = waiting.pop(k)[0]
                    break
        waiting += [(str(m.id), c["id"]) for c in getattr(m, "tool_calls", None) or []]
    open_ai = {mid for mid, _ in waiting}
    problems: set[str] = set()
    request, answered, quoted = None, True, False
    for i, m in enumerate(messages):
        if marked_summary(m):
            quoted = quoted_ok and "\n**Request of the turn " in str(m.content)
            continue
        if m.type == "human":
            if request is not None and not answered:
                problems.add(f"unanswered:{request}")
            request, answered = m.id, False
            continue
        if m.type == "ai":
            answered = True
        if m.type not in ("ai", "tool") or i >= last or request is not None or quoted:
            continue
        if str(m.id) in open_ai or owner.get(str(m.id)) in open_ai:
            continue
        problems.add(f"headless:{m.id}")
    return problems


def shortened_from(new: BaseMessage, old: BaseMessage) -> bool:
    """``new`` is ``old`` (a tool result, a long request kept in place, or a model's own long
    message while no summary was ready) shortened by offpath, as issue 18 allows in a kept
    part: same id, type and call id (a model's message: the same tool calls), marked with the
    original's size, its text the original's head and tail around one ``[offpath: ...]`` line
    (checked here on the texts themselves)."""
    if new.type != old.type or new.type not in ("tool", "human", "ai") or new.id != old.id:
        return False
    if new.type == "tool" and new.tool_call_id != old.tool_call_id:
        return False
    if new.type == "ai" and new.tool_calls != old.tool_calls:
        if not calls_cut(new.tool_calls, old.tool_calls):
            return False
        if new.content == old.content:  # only its tool calls' arguments were cut
            return isinstance(new.additional_kwargs.get("offpath_shortened"), dict)
    return text_shortened(new, old)


def calls_cut(new: list, old: list) -> bool:
    """``new`` are the tool calls ``old`` with some multi-line string arguments cut by
    offpath: the same ids, names and other arguments; a cut one is the original's first line
    and one ``[offpath: ...]`` line that says how many chars are not shown."""
    if [(c["id"], c["name"], sorted(c["args"])) for c in new] != [
        (c["id"], c["name"], sorted(c["args"])) for c in old
    ]:
        return False
    for a, b in zip(new, old, strict=True):
        for key, value in a["args"].items():
            original = b["args"][key]
            if value == original:
                continue
            first, sep, marker = str(value).partition("\n")
            if not (
                sep
                and isinstance(original, str)
                and original.split("\n", 1)[0].startswith(first)
                and marker.startswith(f"[offpath: {len(original):,} chars of this argument")
            ):
                return False
    return True


def text_shortened(new: BaseMessage, old: BaseMessage) -> bool:
    """``new``'s text is ``old``'s shortened by offpath: marked with the original's size, the
    original's head and tail around one ``[offpath: ...]`` line that cites ``old``'s id for
    ``recall`` (or says where it is archived)."""
    mark = new.additional_kwargs.get("offpath_shortened")
    if not isinstance(mark, dict):
        return False
    text, original = str(new.content), str(old.content)
    head, sep, rest = text.partition("\n[offpath: ")
    marker, sep2, tail = rest.partition("]\n")
    if not (sep and sep2) or "not shown" not in marker:
        return False
    if str(old.id)[:8] not in marker:  # the marker names the original for recall
        return False
    if isinstance(old.additional_kwargs.get("offpath_shortened"), dict):
        original_head, _, original_rest = original.partition("\n[offpath: ")
        return original.startswith(head) or original_head.startswith(head)
    return (
        len(text) < len(original)
        and original.startswith(head)
        and original.endswith(tail)
        # the original's size: its text, and a model message's tool-call arguments too
        and (
            mark.get("chars") == len(original)
            or (old.type == "ai" and bool(old.tool_calls) and mark.get("chars", 0) > len(original))
        )
    )


def check_compacted(before: Sequence[BaseMessage], after: Sequence[BaseMessage]) -> BaseMessage:
    """Assert the DESIGN.md invariants on one compaction; return the summary message.

    Issue 18 allows two changes beside the summary: a kept tool result (or a long request
    kept in place) shortened in place (:func:`shortened_from`), and a long request kept as its
    own message right after the summary (a copy of a replaced request message, in the place of
    another replaced one, shortened like a kept result when it is over its cap)."""
    n_sys = 0
    while n_sys < len(before) and before[n_sys].type == "system":
        n_sys += 1
    # system untouched and first
    assert list(after[:n_sys]) == list(before[:n_sys]), "system prompt moved or changed"
    # the summary goes first, and there is one
    summaries = [m for m in after if marked_summary(m)]
    assert len(summaries) == 1, f"expected exactly one summary, got {len(summaries)}"
    summary = after[n_sys]
    assert marked_summary(summary), f"first message after the system prompt is a {summary.type}"
    # nothing lost: replaced + still there == every original id
    replaced = list(summary.additional_kwargs["summary"]["replaced_ids"])
    by_id = {m.id: m for m in before}
    # this compaction's copy (it takes a replaced message's id); an earlier one's is kept
    copies = [
        m for m in after if m.additional_kwargs.get("offpath_request_of") and m.id in replaced
    ]
    assert len(copies) <= 1, "more than one request kept as a copy"
    for copy in copies:
        source = copy.additional_kwargs["offpath_request_of"]
        assert after[n_sys + 1] is copy, "the request's copy does not follow the summary"
        assert copy.type == "human" and source in replaced and copy.id in replaced
        # word for word, or (a request over its cap) its head and tail with a recall pointer
        # to the original, which the summary replaced (and the archive holds)
        same = copy.content == by_id[source].content
        assert same or text_shortened(copy, by_id[source]), "the request's copy is not its own"
    after_ids = [m.id for m in after if m is not summary and not any(m is c for c in copies)]
    before_ids = [m.id for m in before]
    assert not set(replaced) & set(after_ids), "a message is both replaced and kept"
    assert set(replaced) | set(after_ids) == set(before_ids), "a message was lost"
    assert len(replaced) + len(after_ids) == len(before_ids)
    # kept messages unchanged (or, tool results, shortened), in order
    kept_expected = [m for m in before if m.id not in set(replaced)]
    kept_now = [m for m in after if m is not summary and not any(m is c for c in copies)]
    assert [m.id for m in kept_now] == [m.id for m in kept_expected], "kept messages moved"
    for now, then in zip(kept_now, kept_expected, strict=True):
        assert now == then or shortened_from(now, then), f"kept message {now.id} changed"
    # never mid tool-call pair: no new unpaired call or result
    new = pairing_problems(after) - pairing_problems(before)
    assert not new, f"orphaned tool calls/results: {sorted(new)}"
    # whole turns: no request kept without its answer, nor an answer without its request
    broken = turn_problems(after, quoted_ok=False) - turn_problems(before, quoted_ok=False)
    assert not broken, f"turns cut apart: {sorted(broken)}"
    # pending calls stay
    assert pending_calls(before) <= pending_calls(after) | set(), "a pending call was removed"
    return summary


def from_api(items: Sequence[dict[str, Any]]) -> list[BaseMessage]:
    """Messages as ``GET /sessions/{id}/messages`` returns them, back to LangChain messages."""
    out = []
    for item in items:
        item = dict(item)
        extra = item.pop("additional_kwargs", None) or {}
        (m,) = convert_to_messages([item])
        out.append(m.model_copy(update={"additional_kwargs": extra}) if extra else m)
    return out


def check_case(
    doc: dict[str, Any],
    before: Sequence[BaseMessage],
    after: Sequence[BaseMessage],
    *,
    prompts: Sequence[str],
    jobs_queued: int,
    offline_summary: bool,
    state_after: dict[str, Any] | None = None,
) -> None:
    """Assert a case's ``expect`` keys on one run (``before``: every message posted;
    ``after``: the thread afterwards; ``prompts``: texts sent to the summarizer)."""
    expect = doc["expect"]
    if expect.get("enqueued") is False:
        assert jobs_queued == 0, f"{jobs_queued} jobs were queued"
    if expect.get("compacts") is False:
        assert list(after) == list(before), "the thread changed"
        assert not any(marked_summary(m) for m in after)
        return
    if expect.get("compacts"):
        assert any(marked_summary(m) for m in after), "no compaction was applied"
    n_sys = sum(1 for m in before[:1] if m.type == "system")
    summary = check_compacted(before, after)
    if expect.get("summary_first"):
        assert after[n_sys] is summary
    if expect.get("system_untouched"):
        assert after[0] == before[0] and after[0].type == "system"
    if kept := expect.get("kept_verbatim_ids"):
        by_id = {m.id: m for m in before}
        pos = [next(i for i, m in enumerate(after) if m.id == x) for x in kept]
        assert pos == sorted(pos) and pos[0] > n_sys, (
            "kept messages out of order or before the summary"
        )
        assert all(after[p] == by_id[x] for p, x in zip(pos, kept, strict=True)), (
            "a kept message changed"
        )
    if expect.get("no_orphans"):
        assert not pairing_problems(after) - pending_calls(after)
    if expect.get("no_new_orphans"):
        assert pairing_problems(after) <= pairing_problems(before)
    if text := expect.get("request_verbatim"):
        assert any(isinstance(m.content, str) and text in m.content for m in after), "request lost"
    if expect.get("single_summary"):
        assert sum(marked_summary(m) for m in after) == 1
    if bad := expect.get("prompt_must_not_contain"):
        assert prompts, "no prompt was recorded"
        assert all(bad not in p for p in prompts), "the prompt contains forbidden text"
    if limit := expect.get("max_prompt_chars"):
        assert prompts and all(len(p) <= limit for p in prompts), "a prompt is too long"
    if expect.get("state_extra_preserved"):
        assert state_after is not None
        for key, value in doc.get("state_extra", {}).items():
            assert state_after.get(key) == value, f"state key {key!r} changed"
    if offline_summary and (facts := expect.get("facts_for_fidelity")):
        missing = [f for f in facts if f not in summary.content]
        assert not missing, f"the summary lost {missing}"
