"""The loss report of a compaction: what left the model's view, and which of its facts the
summary and the kept messages no longer hold ("a loss report and undo"). Pure.

A compaction takes two things out of the model's view: the messages it removes (replaced
by its summary), and the part of kept tool results it shortens in place. Their facts are
found by the fact guard's extractor (:func:`offpath.compaction.facts.extract`); a fact is
*kept* when its value is still in what the model sees afterwards (the summary message, its
pinned facts included, and every kept message: content, tool-call names and arguments),
compared case-insensitively; otherwise it is *lost* (the archive still has it: ``recall``).

Facts are counted by the guard's ranking (:mod:`offpath.compaction.facts`): what the agent
or the user stated (in their words, a tool call's argument, a value an earlier summary
carried) apart from identifiers only a tool output held (request ids, timestamps, paths of
a listing), which a person reading the report does not act on one by one. Each lost fact
says whether it is *recallable*: an original the archive keeps (a removed message, the
original of a shortened result) holds its value word for word.

Facts chosen independently of the extractor (*ground truth*: a benchmark's expected tool
arguments, an order id a test planted) are checked the same way when given: those that
occur in what left the view, and which of them were lost.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

from offpath.compaction.accounting import content_text, message_chars
from offpath.compaction.facts.extraction import Fact, extract_ranked
from offpath.compaction.facts.patterns import held_in
from offpath.compaction.fields import message_field
from offpath.compaction.summary import archived_as

#: Most lost facts a report lists (the most important first); ``facts_lost`` counts them all.
MAX_LISTED = 50
#: Most chars of one listed value.
MAX_VALUE_CHARS = 200


@dataclass(frozen=True, slots=True)
class LostFact:
    """A fact no longer in the model's view: its ``value``, ``kind`` (the extractor's), the
    id of the message it was first seen in (its original, for ``recall``), whether the agent
    or the user ``stated`` it (else only a tool output held it), whether the agent ``said`` it
    in its own words or the user ``asked`` with it (what a later summary pins again first:
    :func:`offpath.compaction.facts.pinning.pin`'s ``lost``), and whether it is
    ``recallable`` (an archived original holds it word for word)."""

    value: str
    kind: str
    message_id: str
    stated: bool = False
    recallable: bool = True
    said: bool = False
    asked: bool = False


@dataclass(frozen=True, slots=True)
class LossReport:
    """What a compaction took out of the model's view.

    ``messages_removed``, ``chars_removed``: the messages it removed and their size (chars,
    as :func:`~offpath.compaction.accounting.message_chars` counts them);
    ``results_shortened``, ``chars_shortened``: kept tool results it shortened in place and
    the chars that cut; ``facts``: distinct facts in what left the view; ``facts_lost``: how
    many of them neither the summary nor the kept messages hold; ``lost``: those, the
    stated ones first, each part most important first, at most :data:`MAX_LISTED`;
    ``ground_truth``: None, or for facts given as ground truth, how many occur in what left
    the view (``facts``) and which of them were lost (``lost``).

    By rank: ``stated_facts`` / ``stated_lost`` / ``stated_recallable``: the facts the agent
    or the user stated, those of them lost, and of those the recallable ones;
    ``tool_only_facts`` / ``tool_only_lost`` / ``tool_only_recallable``: the same for the
    identifiers only a tool output held. The two parts add up to ``facts`` and
    ``facts_lost``.
    """

    messages_removed: int
    chars_removed: int
    results_shortened: int
    chars_shortened: int
    facts: int
    facts_lost: int
    lost: tuple[LostFact, ...]
    ground_truth: tuple[int, tuple[str, ...]] | None = None
    stated_facts: int = 0
    stated_lost: int = 0
    stated_recallable: int = 0
    tool_only_facts: int = 0
    tool_only_lost: int = 0
    tool_only_recallable: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "messages_removed": self.messages_removed,
            "chars_removed": self.chars_removed,
            "results_shortened": self.results_shortened,
            "chars_shortened": self.chars_shortened,
            "facts": self.facts,
            "facts_lost": self.facts_lost,
            "lost": [
                {
                    "value": f.value,
                    "kind": f.kind,
                    "message_id": f.message_id,
                    "stated": f.stated,
                    "said": f.said,
                    "asked": f.asked,
                    "recallable": f.recallable,
                }
                for f in self.lost
            ],
            "stated": {
                "facts": self.stated_facts,
                "lost": self.stated_lost,
                "recallable": self.stated_recallable,
            },
            "tool_only": {
                "facts": self.tool_only_facts,
                "lost": self.tool_only_lost,
                "recallable": self.tool_only_recallable,
            },
            "ground_truth": None
            if self.ground_truth is None
            else {"facts": self.ground_truth[0], "lost": list(self.ground_truth[1])},
        }


def visible_text(messages: Iterable[BaseMessage]) -> str:
    """What the model reads of ``messages``: each one's text (content parts' text), its tool
    calls (name and arguments, as JSON) and its name; one string."""
    parts: list[str] = []
    for m in messages:
        parts.append(content_text(m.content))
        for call in message_field(m, "tool_calls") or []:
            args = json.dumps(call.get("args") or {}, ensure_ascii=False, default=str)
            parts.append(f"{call.get('name')} {args}")
        if m.name:
            parts.append(m.name)
    return "\n".join(parts)


def loss_report(
    removed: Sequence[BaseMessage],
    summary: str,
    kept: Sequence[BaseMessage],
    *,
    shortened: Sequence[tuple[BaseMessage, BaseMessage]] = (),
    ground_truth: Iterable[str] | None = None,
) -> LossReport:
    """The loss report of one compaction.

    ``removed``: the messages it removed, as the thread held them before it; ``summary``: the
    text of the summary message that replaced them (pinned facts included); ``kept``: every
    other message of the thread once it is applied (system prompt, a kept request's copy,
    kept messages, shortened results as they are now, later messages); ``shortened``: each
    kept result it shortened, as ``(before, after)``. ``ground_truth``: fact strings chosen
    independently of the extractor (a benchmark's), or None.
    """
    before = [b for b, _ in shortened]
    left = [*removed, *before]
    seen = (summary + "\n" + visible_text(kept)).casefold()
    facts = extract_ranked(left)[1]
    values = [f.value.casefold() for f in facts]
    held = held_in(values, seen)
    # what the archive keeps, message by message: their texts joined are what it keeps
    # whole (each message gives its text at least, and case folding maps char by char)
    texts = [visible_text([m]).casefold() for m in left]
    by_id = {archived_as(m): text for m, text in zip(left, texts, strict=True)}
    archived = "\n".join(texts)
    # one pass over the facts, each one's case-folded value and tool_only read once: the lost
    # ones, the stated first, each part by rank
    stated_gone: list[tuple[Fact, str]] = []
    tool_only_gone: list[tuple[Fact, str]] = []
    stated_facts = 0
    for f, value in zip(facts, values, strict=True):
        tool_only = f.tool_only
        stated_facts += not tool_only
        if value not in held:
            (tool_only_gone if tool_only else stated_gone).append((f, value))
    # recallable: an original holds it word for word. The message a fact was first seen in
    # mostly does; the lost values it does not hold are looked for in all of them at once
    elsewhere = {
        value
        for f, value in (*stated_gone, *tool_only_gone)
        if value not in by_id.get(f.message_id, "")
    }
    in_archive = held_in(elsewhere, archived) if elsewhere else set()
    stated_lost = [(f, value not in elsewhere or value in in_archive) for f, value in stated_gone]
    tool_only_lost = [
        (f, value not in elsewhere or value in in_archive) for f, value in tool_only_gone
    ]
    lost = stated_lost + tool_only_lost

    truth = None
    if ground_truth is not None:
        wanted = [g for g in dict.fromkeys(ground_truth) if g]
        gone = held_in((g.casefold() for g in wanted), archived)
        present = [g for g in wanted if g.casefold() in gone]
        kept_in_view = held_in((g.casefold() for g in present), seen)
        truth = (len(present), tuple(g for g in present if g.casefold() not in kept_in_view))
    return LossReport(
        messages_removed=len(removed),
        chars_removed=sum(message_chars(m) for m in removed),
        results_shortened=len(shortened),
        chars_shortened=sum(message_chars(b) - message_chars(a) for b, a in shortened),
        facts=len(facts),
        facts_lost=len(lost),
        lost=tuple(
            LostFact(
                f.value[:MAX_VALUE_CHARS],
                f.kind,
                f.message_id,
                stated=i < len(stated_lost),
                recallable=recallable,
                said=f.said,
                asked=f.asked,
            )
            for i, (f, recallable) in enumerate(lost[:MAX_LISTED])
        ),
        ground_truth=truth,
        stated_facts=stated_facts,
        stated_lost=len(stated_lost),
        stated_recallable=sum(r for _, r in stated_lost),
        tool_only_facts=len(facts) - stated_facts,
        tool_only_lost=len(tool_only_lost),
        tool_only_recallable=sum(r for _, r in tool_only_lost),
    )


def lost_again(reports: Sequence[Sequence[Any]]) -> tuple[Fact, ...]:
    """The facts that the agent said in its own words or the user named, from the ``lost``
    lists of a thread's loss reports (:meth:`LossReport.to_json`, oldest first; an entry
    without ``said`` or ``asked`` is not one), as the fact guard pins them again
    (:attr:`~offpath.compaction.planner.CompactionPlan.lost`): each value once, carried, its
    age the reports after the newest that lists it, plus one (what the summary before that
    compaction listed)."""
    out: dict[str, Fact] = {}
    for age, lost in enumerate(reversed(reports), start=1):  # the newest first
        for entry in lost:
            if not isinstance(entry, dict):
                continue
            value, said, asked = entry.get("value"), entry.get("said"), entry.get("asked")
            if not isinstance(value, str) or not value or not (said or asked):
                continue
            if len(value) >= MAX_VALUE_CHARS or value.casefold() in out:
                continue  # clipped in the report; or lost again by a later compaction
            out[value.casefold()] = Fact(
                value,
                str(entry.get("kind") or "name"),
                str(entry.get("message_id") or ""),
                "",
                stated=bool(said),
                asked=bool(asked),
                carried=True,
                said=bool(said),
                age=age,
            )
    return tuple(out.values())
