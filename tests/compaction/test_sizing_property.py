"""A long thread's caps kept incrementally (:class:`offpath.compaction.tracking.MessageSizes`, as
the middleware keeps them across model calls) equal the caps computed from scratch
(:func:`offpath.compaction.shorten.older_caps`) after each step of a random history: messages
appended, older ones shortened in place, messages removed, a compaction applied (a summary in
place of the oldest messages), with keep windows, needs and request floors drawn anew at each
call."""

from __future__ import annotations

from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from offpath.compaction.accounting import total_chars
from offpath.compaction.shorten import MIN_OLDER_CHARS, older_caps, shorten
from offpath.compaction.tracking import MessageSizes

SIZES = st.sampled_from([0, 15, 90, 250, 399, 400, 401, 650, 1_200, 3_000, 9_000])


@st.composite
def message(draw, n: int) -> BaseMessage:
    kind = draw(st.sampled_from(["tool", "tool", "ai", "ai_call", "human", "summary", "system"]))
    text = "x" * draw(SIZES)
    if kind == "tool":
        body = "\n".join(text[k : k + 60] for k in range(0, len(text), 60))
        return ToolMessage(id=f"t{n}", content=body, tool_call_id=f"c{n}")
    if kind == "ai":
        return AIMessage(id=f"a{n}", content=text)
    if kind == "ai_call":
        arg = "line\n" * (draw(SIZES) // 5)
        return AIMessage(
            id=f"a{n}",
            content=text,
            tool_calls=[{"id": f"c{n}", "name": "write", "args": {"body": arg, "path": "/x"}}],
        )
    if kind == "human":
        return HumanMessage(id=f"h{n}", content=text)
    if kind == "summary":
        return HumanMessage(
            id=f"s{n}", content="Summary\n" + text, additional_kwargs={"lc_source": "summarization"}
        )
    return SystemMessage(id=f"y{n}", content=text)


STEP = st.sampled_from(["append", "append", "append", "shorten", "remove", "compact"])


@given(data=st.data())
@hyp_settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_incremental_caps_equal_caps_from_scratch(data) -> None:
    counter = iter(range(10**6))
    thread: list[BaseMessage] = []
    sizes = MessageSizes()
    for _ in range(data.draw(st.integers(3, 12), label="calls")):
        step = data.draw(STEP, label="step")
        if step == "append" or not thread:
            new = data.draw(st.lists(message(0), min_size=1, max_size=25), label="new")
            thread += [m.model_copy(update={"id": f"{m.id}-{next(counter)}"}) for m in new]
        elif step == "shorten":  # older messages shortened in place, as a call over does
            at = data.draw(st.lists(st.integers(0, len(thread) - 1), max_size=5), label="at")
            cap = data.draw(st.sampled_from([MIN_OLDER_CHARS, 300, 500, 2_000]), label="cap")
            changed = []
            for i in set(at):
                short = shorten(thread[i], cap, floor=MIN_OLDER_CHARS)
                if short is not thread[i]:
                    thread[i] = short
                    changed.append(i)
            if data.draw(st.booleans(), label="told"):
                sizes.replaced(changed, thread)  # the middleware says which it replaced
        elif step == "remove":
            at = data.draw(st.integers(0, len(thread) - 1), label="removed")
            del thread[at]
        else:  # a compaction applied: a summary in place of the oldest messages
            cut = data.draw(st.integers(1, len(thread)), label="cut")
            summary = HumanMessage(
                id=f"sum-{next(counter)}",
                content="Summary of the conversation so far\n" + "y" * 700,
                additional_kwargs={"lc_source": "summarization"},
            )
            thread = [summary, *thread[cut:]]
        sizes.sync(thread, total_chars(thread))
        assert sizes.chars == total_chars(thread)
        for _ in range(2):  # two calls on the same thread: the sorted lists move
            keep = data.draw(st.sampled_from([0, 1, 200, 800, 2_500, 6_000, 50_000]), label="k")
            need = data.draw(st.integers(-100, 30_000), label="need")
            new_from = data.draw(st.none() | st.integers(0, len(thread)), label="new_from")
            floor = data.draw(st.sampled_from([MIN_OLDER_CHARS, 350, 1_000]), label="floor")
            expected = older_caps(thread, keep, need, new_from, floor)
            assert sizes.older_caps(keep, need, new_from, floor) == expected


def test_a_thread_is_sized_once_across_calls() -> None:
    """Calls that only add messages size only the messages added."""
    thread: list[BaseMessage] = [
        ToolMessage(id=f"t{i}", content="r" * 900, tool_call_id=f"c{i}") for i in range(1_000)
    ]
    sizes = MessageSizes()
    assert sizes.sync(thread, total_chars(thread)) == 1_000
    first = sizes.older_caps(5_000, 20_000, len(thread))
    assert first == older_caps(thread, 5_000, 20_000, len(thread))
    thread.append(HumanMessage(id="h", content="next"))
    assert sizes.sync(thread, total_chars(thread)) == 1
    assert sizes.older_caps(5_000, 20_000) == older_caps(thread, 5_000, 20_000)


def test_a_thread_changed_unseen_is_sized_again() -> None:
    """A message replaced without being told (its size no longer the state's count) and a
    message removed make the thread be sized again."""
    thread: list[BaseMessage] = [
        ToolMessage(id=f"t{i}", content="r" * 900, tool_call_id=f"c{i}") for i in range(50)
    ]
    sizes = MessageSizes()
    sizes.sync(thread, total_chars(thread))
    thread[3] = shorten(thread[3], 300, floor=MIN_OLDER_CHARS)
    assert sizes.sync(thread, total_chars(thread)) == 50
    del thread[10]
    assert sizes.sync(thread, total_chars(thread)) == 49
    assert sizes.older_caps(2_000, 10_000) == older_caps(thread, 2_000, 10_000)


def test_sized_threads_hold_at_most_their_messages() -> None:
    """The sizes kept for a process's threads hold at most ``max_messages`` messages: the
    threads used least recently are forgotten first; a thread's sizes go to one call at a
    time."""
    from offpath.compaction.tracking import SizedThreads

    def sized(n: int) -> MessageSizes:
        sizes = MessageSizes()
        sizes.append(HumanMessage(id=f"h{i}", content="q") for i in range(n))
        return sizes

    kept = SizedThreads(max_messages=100)
    kept.give("a", sized(40))
    kept.give("b", sized(40))
    assert kept.take("a").n == 40  # "a" is taken: a call of it meanwhile gets its own
    assert kept.take("a").n == 0
    kept.give("a", sized(40))
    kept.give("c", sized(40))  # 120 messages: "b", the least recently used, is forgotten
    assert kept.take("b").n == 0
    assert kept.take("c").n == 40
    kept.give("d", sized(101))  # over the bound alone: not kept
    assert kept.take("d").n == 0
