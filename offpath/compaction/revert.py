"""Undoing a compaction: the thread with its originals back in place of its summary (DESIGN.md
invariant 16, "a swap can be undone"). Pure.

A compaction left the thread as: system prompt, its summary (which took the id of the first
message it removed), a copy of a long request (the id of the second, if it kept one), the
kept messages (some tool results shortened in place), then what came since. The archive holds
what it changed, byte for byte (``messages_to_dict`` form), each removed message with its
index in the thread when it was removed, and each kept result it shortened as it was.

:func:`reverted` builds the thread as it would be had the compaction never happened: the
removed messages go back at their indexes (the summary and the request copy, which reuse
their ids, go), the shortened results are restored, and every other message stays, in its
order, after them what came since. It raises :class:`RevertConflict` when the thread no
longer fits the archive (a removed id reused by a later message, a shortened result gone,
indexes that do not fit): then nothing is to be written.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import BaseMessage

__all__ = ["RevertConflict", "reverted"]


class RevertConflict(ValueError):
    """The thread no longer fits what the archive says the compaction changed."""


def reverted(
    thread: Sequence[BaseMessage],
    summary_id: str,
    removed: Sequence[tuple[int, BaseMessage]],
    shortened: Sequence[BaseMessage] = (),
    request_copy: str | None = None,
) -> list[BaseMessage]:
    """The messages of ``thread`` with the compaction whose summary has id ``summary_id``
    undone.

    ``removed``: its removed messages as archived, ``(index in the thread when removed,
    message)``; ``shortened``: the kept results it shortened, as archived (the thread holds
    them shortened, by the same ids); ``request_copy``: the id of the request whose copy it
    kept after the summary (the copy has the id of the second removed message), or None.
    The result is a new list; the messages in it are those given (nothing is copied).
    Raises :class:`RevertConflict`.
    """
    if not removed:
        raise RevertConflict("the archive holds no message this compaction removed")
    gone = {str(m.id) for _, m in removed}
    if summary_id not in gone:
        raise RevertConflict(f"the summary {summary_id} took the id of no removed message")
    stand_ins = {summary_id}
    if request_copy is not None:
        ordered = [str(m.id) for _, m in sorted(removed, key=lambda r: r[0])]
        if len(ordered) > 1:
            stand_ins.add(ordered[1])
    if sum(str(m.id) == summary_id for m in thread) != 1:
        raise RevertConflict(f"the summary {summary_id} is not in the thread once")
    rest: list[BaseMessage] = []
    for m in thread:
        mid = str(m.id)
        if mid in stand_ins:
            stand_ins.discard(mid)  # the summary (and the request's copy), once each
        elif mid in gone:
            raise RevertConflict(f"message id {mid} was used again after the compaction")
        else:
            rest.append(m)
    by_index = dict(removed)
    if len(by_index) != len(removed):
        raise RevertConflict("two removed messages were archived at one index")
    out: list[BaseMessage] = []
    it = iter(rest)
    for index in range(max(by_index) + 1):
        if index in by_index:
            out.append(by_index[index])
            continue
        nxt = next(it, None)
        if nxt is None:
            raise RevertConflict(
                f"the thread is shorter than the archive says: nothing kept before index {index}"
            )
        out.append(nxt)
    out.extend(it)
    where = {str(m.id): i for i, m in enumerate(out)}
    for original in shortened:
        sid = str(original.id)
        i = where.get(sid)
        if i is None or sid in gone:
            raise RevertConflict(f"the shortened result {sid} is no longer in the thread")
        out[i] = original
    return out
