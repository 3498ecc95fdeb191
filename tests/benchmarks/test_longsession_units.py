"""The pure parts of benchmark 20 (bench/longsession.py): where a stated fact not in view was
last in view."""

from __future__ import annotations

from bench.longsession import Fact, last_seen


def fact(value: str) -> Fact:
    return Fact(value=value, kind="name", loop=0, reply=0, query="")


def test_a_fact_not_in_view_is_counted_where_it_was_last_in_view():
    # benchmark 20's question: of the agent's facts no longer in view, how many a summary
    # dropped and how many left the kept part without being pinned
    pinned, kept, gone, late = fact("pod-a7"), fact("pod-b8"), fact("pod-c9"), fact("pod-d0")
    facts = [pinned, kept, gone]
    seen: dict[int, str] = {}
    first = last_seen(facts, {id(pinned), id(kept)}, "- ids (said): pod-a7", seen)
    assert first == {"never": 1}  # pod-c9: stated and gone before the first point
    second = last_seen([*facts, late], {id(late)}, "- ids (said): pod-d0", seen)
    assert second == {"summary": 1, "kept": 1, "never": 1}
