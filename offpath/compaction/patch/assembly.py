"""Assembling the patch of a prepared compaction: the summary in the first removed message's
place, a kept request's copy in the second's, ``RemoveMessage`` for the rest, and kept tool
results shortened while the thread would be over its target. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, RemoveMessage, ToolMessage

from offpath.compaction.accounting import message_chars
from offpath.compaction.budget import fit_summary
from offpath.compaction.index import archive_index, index_room
from offpath.compaction.patch.prepared import Prepared
from offpath.compaction.shorten import caps_for, shorten
from offpath.compaction.summary.message import build_summary_message

#: ``additional_kwargs`` key of the copy of a long request kept as its own message: the id of
#: the request message it copies (issue 18, item 2).
REQUEST_COPY = "offpath_request_of"


@dataclass(frozen=True, slots=True)
class _Attempt:
    summary: HumanMessage
    patch: list[BaseMessage]
    shortened: dict[str, BaseMessage]
    after: int


def _assemble(
    prepared: Prepared,
    messages: Sequence[BaseMessage],
    by_id: Mapping[Any, BaseMessage],
    gone: list[str],
    since: str,
    recall: bool,
    target: int | None,
    sizes: Mapping[Any, int],
    copy: bool = True,
    cap: int = 0,
) -> _Attempt:
    """The patch that removes ``gone`` (the summary in the first one's place, a kept request's
    copy in the second's) and shortens the plan's kept results, then more of them while the
    thread would be over ``target``; and the thread's size after it. ``copy`` False: the
    plan's request copy is left out (its turn went whole).

    The summary gets ``since`` (the sections added at the apply) and the archive's index
    (:func:`~offpath.compaction.index.archive_index`, over every message it replaces) before
    its last line, the recall note; then the whole message is fitted to ``cap`` chars (0: no
    bound) by :func:`~offpath.compaction.budget.fit_summary`."""
    removed_chars = sum(sizes[i] for i in gone)
    text = prepared.summary_text.rstrip()
    index = archive_index([by_id[i] for i in gone], index_room(cap))
    added = "\n\n".join(x for x in (since, index) if x)
    if added:  # before the summary's last line, the recall note, when it has one
        body, sep, last = text.rpartition("\n\n")
        if sep and last.startswith("_") and last.endswith("_"):
            text = f"{body}\n\n{added}\n\n{last}"
        else:
            text = f"{text}\n\n{added}"
    summary = build_summary_message(
        message_id=gone[0],
        summary_text=text,
        replaced_ids=gone,
        replaced_chars=removed_chars,
        summarizer=prepared.summarizer,
        compactions=prepared.compactions,
        request=prepared.request,
        extra={**prepared.meta, "job_id": prepared.job_id, "model": prepared.model},
    )
    content = fit_summary(str(summary.content), cap)
    if content != summary.content:
        summary = summary.model_copy(update={"content": content})
    patch: list[BaseMessage] = [summary]
    added = message_chars(summary)
    copy_of = prepared.request_copy if copy else None
    if copy_of is not None:
        source = by_id[copy_of]
        if copy_of in prepared.shorten:  # a long request: its copy is shortened, and cites it
            source = shorten(source, prepared.shorten[copy_of], recall=recall)  # type: ignore[arg-type]
        copy = HumanMessage(
            id=gone[1],
            content=source.content,
            additional_kwargs={**source.additional_kwargs, REQUEST_COPY: copy_of},
        )
        patch.append(copy)
        added += message_chars(copy)
    patch += [RemoveMessage(id=i) for i in gone[1 if copy_of is None else 2 :]]
    after = sum(sizes.values()) - removed_chars + added
    gone_set = set(gone)
    kept_results = {
        str(m.id): sizes[m.id]
        for m in messages
        if m.id not in gone_set and (isinstance(m, ToolMessage) or m.id in prepared.shorten)
    }
    caps = {i: c for i, c in prepared.shorten.items() if i in kept_results}
    shortened: dict[str, BaseMessage] = {}

    def apply_caps() -> int:
        for i, cap in caps.items():
            if i in shortened and message_chars(shortened[i]) <= cap:
                continue
            new = shorten(by_id[i], cap, recall=recall)  # type: ignore[arg-type]
            if new is not by_id[i]:
                shortened[i] = new
        return sum(kept_results[i] - message_chars(new) for i, new in shortened.items())

    saved = apply_caps()
    if target is not None and after - saved > target:
        more = caps_for(  # tool results only: a kept request is shortened to its cap, no lower
            [
                (i, message_chars(shortened.get(i, by_id[i])))
                for i in kept_results
                if isinstance(by_id[i], ToolMessage)
            ],
            after - saved - target,
        )
        for i, cap in more.items():
            caps[i] = min(cap, caps.get(i, cap))
        saved = apply_caps()
    patch += list(shortened.values())
    return _Attempt(summary, patch, shortened, after - saved)
