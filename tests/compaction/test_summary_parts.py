"""Issue 32, items 2-4 in the summary: standing instructions shown once and never as the
request, the values the user fixed kept word for word for the session's life (Decisions),
"(done)" only when shown done, the archive's index carried over compactions, and the order
in which a summary over its budget gives up whole lines.

The expected values are written into the inputs below by hand."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.graph.message import add_messages

from offpath.compaction.budget import LEFT_OUT, fit_summary, least_chars
from offpath.compaction.facts.sections import PINNED_HEADING, SINCE_HEADING, SWAP_HEADING
from offpath.compaction.frontier import DECISIONS_HEADING, ORIGINAL_HEADING, decision_of
from offpath.compaction.index import (
    INDEX_HEADER,
    INDEX_HEADING,
    archive_index,
    merge_oldest,
    shorter_line,
)
from offpath.compaction.pipeline import Compaction, compact
from offpath.compaction.summarizers.base import SummaryResult
from offpath.compaction.summarizers.guarded import GuardedSummarizer
from offpath.compaction.summarizers.offline import OfflineSummarizer
from offpath.compaction.summary import (
    HEADINGS,
    REQUEST_HEADING,
    summary_body,
    template_problem,
)
from offpath.config import load_settings

S = load_settings(summarization_threshold_chars=20_000, summarization_keep_chars=6_000)

#: A real SRE agent's block, appended to every user message (issue 32: ~600 chars).
GLOBAL = (
    "Global Instructions\n"
    "You may receive a set of “Global Instructions” that describe how to perform certain tasks, "
    "handle certain situations, and apply certain best practices. Follow these instructions "
    "when relevant to the task at hand. Always check the runbooks first, prefer read-only "
    "commands, report the namespace and the time window you looked at, and never run a "
    "command that changes the cluster without asking. Answer in English, cite the tool output "
    "you rely on, and keep the final answer under 300 words unless asked for more."
)
REMINDER = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following context: "
    "the repository is a Python project managed with uv; tests run with pytest.\n"
    "</system-reminder>"
)


class Generic:
    """An LLM-shaped summarizer that names nothing specific."""

    name = "generic"

    def summarize(self, plan, prompt):
        return SummaryResult(
            text="**Investigating:** the original problem\n**Key findings:**\n"
            "- several things were looked at\n**Ruled out:** nothing ruled out yet\n"
            "**Current state:** work goes on",
            model="generic",
        )


SUMMARIZERS = {
    "offline": lambda: GuardedSummarizer(OfflineSummarizer(), 4_000),
    "generic": lambda: GuardedSummarizer(Generic(), 4_000),
}


def steps(prefix: str, n: int, chars: int = 1_500) -> list:
    out = []
    for i in range(n):
        cid = f"{prefix}-c{i}"
        out += [
            AIMessage(
                id=f"{prefix}-a{i}",
                content="",
                tool_calls=[{"id": cid, "name": "kubectl_logs", "args": {"n": i}}],
            ),
            ToolMessage(
                id=f"{prefix}-t{i}",
                content="\n".join(
                    f"10:{k % 60:02d}:07Z INFO step {i} line {k} ok" for k in range(chars // 30)
                ),
                tool_call_id=cid,
            ),
        ]
    return out


def summary_text(messages, kind) -> str:
    outcome = compact(messages, S, SUMMARIZERS[kind]())
    assert isinstance(outcome, Compaction), outcome
    return str(outcome.summary.content)


@pytest.mark.parametrize("kind", SUMMARIZERS)
@pytest.mark.parametrize("block", [GLOBAL, REMINDER], ids=["global", "reminder"])
def test_a_block_sent_with_every_user_message_is_shown_once_never_as_the_request(kind, block):
    task = "Find why the p99 latency of checkout-api rose after the 14:05 deploy."
    msgs = [
        SystemMessage(id="sys", content="sys"),
        HumanMessage(id="h1", content=f"{task}\n\n{block}"),
    ]
    msgs += steps("a", 4)
    msgs += [AIMessage(id="r1", content="Checked 4 pods so far. Shall I continue?")]
    msgs += [HumanMessage(id="h2", content=f"continue\n\n{block}")]
    msgs += steps("b", 12)
    text = summary_text(msgs, kind)
    investigating = text.split(HEADINGS[1])[0]
    assert f"{HEADINGS[0]} {task}\n" in investigating  # the task, not "continue" nor the block
    assert "continue" not in investigating and ORIGINAL_HEADING not in investigating
    marker = "Global Instructions" if block is GLOBAL else "you can use the following context"
    if block is GLOBAL:  # shown once, in its own line, short
        (line,) = [x for x in text.splitlines() if marker in x]
        assert line.startswith("- Standing instructions") and len(line) < 200
    else:  # a system reminder is never a request: left out
        assert marker not in investigating


@pytest.mark.parametrize("kind", SUMMARIZERS)
def test_a_task_is_done_only_when_its_answer_shows_it_done(kind):
    a = "Rotate the TLS certificate of gateway-41 before it expires."
    b = "Now find why the payments-17 queue keeps growing."

    def session(answer: str) -> list:
        msgs = [SystemMessage(id="sys", content="sys"), HumanMessage(id="ha", content=a)]
        msgs += steps("a", 4)
        msgs += [AIMessage(id="fa", content=answer), HumanMessage(id="hb", content=b)]
        return msgs + steps("b", 10)

    done = summary_text(session("The certificate is rotated; it now expires in 2027."), kind)
    assert f"{ORIGINAL_HEADING} (done): {a}" in done
    interim = summary_text(session("3 of 5 checks are done so far. Shall I go on?"), kind)
    assert f"{ORIGINAL_HEADING} (earlier): {a}" in interim and "(done)" not in interim


@pytest.mark.parametrize("kind", SUMMARIZERS)
def test_a_value_the_user_fixed_is_kept_word_for_word_for_the_sessions_life(kind):
    title = 'Approved. Use exactly this title: "Q3 checkout latency: the 14:05 deploy doubled p99"'
    msgs = [
        SystemMessage(id="sys", content="sys"),
        HumanMessage(id="h1", content="Write the incident report for the checkout-api latency."),
        AIMessage(id="p1", content='Proposed title: "Checkout latency incident".'),
        HumanMessage(id="h2", content=title),
    ]
    msgs += steps("a", 12)
    summarizer = SUMMARIZERS[kind]()
    seen = 0
    for k in range(4):  # compacted again and again: each summary folds the one before it
        outcome = compact(msgs, S, summarizer)
        assert isinstance(outcome, Compaction), outcome
        msgs = add_messages(msgs, outcome.patch)
        text = str(outcome.summary.content)
        decisions = text.split(DECISIONS_HEADING, 1)[1].split(HEADINGS[1])[0]
        assert f"- {title}\n" in decisions
        assert template_problem(summary_body(outcome.summary)) is None  # the seed's headings
        seen += 1
        msgs += [HumanMessage(id=f"more{k}", content=f"Go on with part {k}.")]
        msgs += steps(f"r{k}", 12)
    assert seen == 4


def test_the_archive_index_keeps_a_line_per_span_and_merges_the_oldest():
    thread = [SystemMessage(id="sys", content="sys")]
    spans = []
    summarizer = SUMMARIZERS["offline"]()
    for k in range(5):
        thread += [HumanMessage(id=f"h{k}", content=f"Check the service payments-{k}0 now.")]
        thread += steps(f"s{k}", 14)
        outcome = compact(thread, S, summarizer)
        assert isinstance(outcome, Compaction), outcome
        thread = add_messages(thread, outcome.patch)
        text = str(outcome.summary.content)
        index = text.split(INDEX_HEADING, 1)[1].split("\n\n")[0].splitlines()[1:]
        spans.append(index)
        assert all(line.startswith("- turn") for line in index)
        assert index[0].startswith("- turn 1") or index[0].startswith("- turns 1-")
        assert "tools kubectl_logs x" in index[-1]
    assert len(spans[-1]) >= 2  # the spans stay apart while they fit
    lines = ["- turns 1-2, 10 messages from a1: tools x x2; topics: p, q"]
    lines += ["- turn 3, 4 messages from b1: tools x, y; topics: r", "- turn 4, 2 messages from c1"]
    merged = merge_oldest(lines)
    assert merged == [
        "- turns 1-3, 14 messages from a1 (2 spans): tools x x3, y; topics: p, r, q",
        "- turn 4, 2 messages from c1",
    ]
    room = len(INDEX_HEADER) + 80
    assert archive_index([], room) == ""


def test_a_span_line_over_the_index_room_names_fewer_tools_then_topics_never_fewer_turns():
    line = (
        "- turns 1-40, 300 messages from a1 (12 spans): tools get x9, logs x5, describe x2; "
        "topics: pod-7, 512 Mi"
    )
    steps = [line]
    while (less := shorter_line(steps[-1])) is not None:
        steps.append(less)
    assert steps[1:] == [
        "- turns 1-40, 300 messages from a1 (12 spans): tools get x9, logs x5; topics: pod-7, 512 Mi",
        "- turns 1-40, 300 messages from a1 (12 spans): tools get x9, logs x5; topics: pod-7",
        "- turns 1-40, 300 messages from a1 (12 spans): tools get x9, logs x5",
        "- turns 1-40, 300 messages from a1 (12 spans): tools get x9",
    ]
    assert shorter_line("- turn 3, 4 messages from b1") is None
    assert shorter_line("not a span line") is None
    # an earlier summary's index whose one line is over the room: the line is shortened to fit
    earlier = HumanMessage(
        id="s1",
        content=f"[Context from earlier in this session, summarized]\n\n{INDEX_HEADER}\n{line}",
        additional_kwargs={"lc_source": "summarization"},
    )
    room = len(INDEX_HEADER) + 1 + len(steps[3])
    index = archive_index([earlier], room)
    assert index.splitlines() == [INDEX_HEADER, steps[3]]
    assert len(index) <= room


def test_a_summary_over_its_budget_gives_up_whole_lines_in_order():
    content = "\n".join(
        [
            "[Context from earlier in this session, summarized]",
            "",
            f"{HEADINGS[0]} Find why checkout-api is slow.",
            f"{DECISIONS_HEADING}",
            "- Use the title: Q3 latency",
            HEADINGS[1],
            *(f"- finding number {k} about checkout-api-{k}" for k in range(6)),
            f"{HEADINGS[2]} redis is healthy; the network is fine.",
            f"{HEADINGS[3]} checking the deploy of 14:05.",
            "",
            f"{PINNED_HEADING} (`recall` finds each):",
            *(f"- `pinned line {k} with id-{k}` (m{k})" for k in range(8)),
            "",
            f"{SWAP_HEADING} (named by messages that came after it; `recall` reads them):",
            "- `the line naming ord-77` (m9)",
            "- `pinned line 0 with id-0` (m0)",  # repeats a pinned line: kept once, here
            "",
            "_The originals are archived: `recall` reads them (words or a message id)._",
        ]
    )
    whole = fit_summary(content, 0)
    assert whole.count("pinned line 0 with id-0") == 1
    assert whole.index("pinned line 0 with id-0") > whole.index(SWAP_HEADING)
    inputs = set(content.splitlines())
    least = least_chars(content)
    for cap in range(least, len(whole) + 1, 7):
        fitted = fit_summary(content, cap)
        assert len(fitted) <= cap
        for line in fitted.splitlines():  # whole lines, or a heading whose text was left out
            assert line in inputs or line.endswith(LEFT_OUT), line
        assert "- `the line naming ord-77` (m9)" in fitted  # the swap's pins stay
        if cap >= least + len(DECISIONS_HEADING) + len("- Use the title: Q3 latency") + 2:
            assert "- Use the title: Q3 latency" in fitted  # the decisions go last but one
        assert all(h in fitted for h in HEADINGS)
        findings = [x for x in fitted.splitlines() if x.startswith("- finding")]
        swap_line = "- `pinned line 0 with id-0` (m0)"  # the swap's copy
        pinned = [x for x in fitted.splitlines() if x.startswith("- `pinned") and x != swap_line]
        if len(findings) > 3:  # the findings past the first three go before any pinned fact
            assert len(pinned) == 7
        if len(findings) < 3:  # and the first three after every pinned fact
            assert not pinned


@pytest.mark.parametrize(
    "text, fixed",
    [
        ('Approved: "Q3 checkout latency"', 'Approved: "Q3 checkout latency"'),
        ("Go with option B.", "Go with option B."),
        ("Use postgres, not mysql.", "Use postgres, not mysql."),
        ("Do not touch the billing config.", "Do not touch the billing config."),
        ("Check the service payments-10 now.", None),
        ("continue", None),
        # a long brief: only its sentences that fix a value in so many words
        ("Let's use find_file to see where it is. " * 12, None),
        (
            "Write the report. " * 30 + "The title must be: Q3 latency. " + "Add graphs. " * 5,
            "The title must be: Q3 latency.",
        ),
    ],
)
def test_a_decision_is_what_the_user_fixes_word_for_word(text, fixed):
    assert decision_of(text) == fixed


def test_a_quoted_request_stays_word_for_word_when_the_summary_is_fitted():
    request = "Fix this:\n\n\n```\n]\n]\n```\n\n**Key findings:** not a heading here"
    content = "\n".join(
        [
            "[Context from earlier in this session, summarized]",
            "",
            f"{HEADINGS[0]} Fix the parser.",
            HEADINGS[1],
            *(f"- finding {k}" for k in range(20)),
            f"{HEADINGS[2]} nothing",
            f"{HEADINGS[3]} editing",
            "",
            f"{REQUEST_HEADING}\n{request}",
        ]
    )
    for cap in (0, len(content) - 40):
        fitted = fit_summary(content, cap)
        assert fitted.endswith(f"{REQUEST_HEADING}\n{request}")


def test_what_the_agent_said_outlasts_the_since_sections_quotes_and_the_index_detail():
    """Over its budget, a summary merges its index's spans and counts the since-section's
    turns (``recall`` reads them) before it gives up a value the agent said."""
    said = ", ".join(f"shard_{k}_lag" for k in range(10))
    content = "\n".join(
        [
            "[Context from earlier in this session, summarized]",
            "",
            f"{HEADINGS[0]} the ledger lag",
            "",
            f"{PINNED_HEADING} (`recall` finds each):",
            f"- names (said): {said}",
            "",
            f"{SINCE_HEADING} (6 later messages, not summarized yet; their facts, by message):",
            *(
                f'- Request (answered): "check the replica number {k} again" (recall("h{k}")); '
                f'answer: "replica {k} is fine" (recall("a{k}"))'
                for k in range(3)
            ),
            "",
            f"{INDEX_HEADING} (what compactions removed; `recall` finds it by these words or an id):",
            *(
                f"- turn {k}, 4 messages from m{k}: tools get_rows x2; topics: shard_{k}_x"
                for k in range(1, 5)
            ),
        ]
    )
    fitted = fit_summary(content, len(content) - 200)
    assert len(fitted) <= len(content) - 200
    assert f"- names (said): {said}" in fitted, fitted
    assert "earlier turn(s) went too" in fitted or fitted.count("- Request (") < 3, fitted


def test_the_index_made_beside_the_summary_is_no_longer_than_the_one_it_was_fitted_with():
    # the guard fits the text and the pins beside the index made without the summary's text;
    # the apply makes it again with that text (shown topics left out): a topic the pins hold
    # is not replaced by a longer one further down, or the summary lands over its budget
    # and gives up a pinned line for a few chars
    said = [AIMessage(id=f"s{k}", content=f"Ticket T-{k}00 is the one.") for k in range(6)]
    calls = [
        AIMessage(
            id=f"a{k}",
            content="",
            tool_calls=[
                {"id": f"c{k}", "name": "lookup", "args": {"ref": f"ledger-entry-{k:04d}-x"}}
            ],
        )
        for k in range(4)
    ]
    removed = [HumanMessage(id="h1", content="Check the tickets."), *said, *calls]
    plain = archive_index(removed, 10_000)
    assert "T-000" in plain and "ledger-entry" not in plain  # six topics, the said ones first
    shown = archive_index(removed, 10_000, "- ids (said): T-000, T-100, T-200")
    assert "T-000" not in shown and "T-300" in shown
    assert len(shown) <= len(plain)


def test_the_index_names_no_opaque_value_only_tool_output_held():
    # times of day that recur across search results (every flight leaves at 14:00:00) are
    # listed by the pins as one range, never one by one; as topics they took the index's room
    # from the ids the agent used (benchmark 14: "topics: 02:00:00, 11:00:00, 22:00:00")
    results = [
        ToolMessage(
            id=f"t{k}",
            content=f'[{{"flight": "ZA{k}01", "departs": "14:00:00", "arrives": "22:00:00"}}]',
            tool_call_id=f"c{k}",
        )
        for k in range(3)
    ]
    calls = [
        AIMessage(
            id=f"a{k}",
            content="",
            tool_calls=[{"id": f"c{k}", "name": "search", "args": {"day": f"2024-05-1{k}"}}],
        )
        for k in range(3)
    ]
    removed = [HumanMessage(id="h1", content="Find me a flight, booking QX77RT.")]
    for call, result in zip(calls, results, strict=True):
        removed += [call, result]
    index = archive_index(removed, 10_000)
    assert "QX77RT" in index and "2024-05-10" in index
    assert "14:00:00" not in index and "22:00:00" not in index
