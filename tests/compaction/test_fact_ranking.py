"""The fact guard ranks facts by what the agent relies on: what it said in its own words and
what the user named first, identifiers only a tool's output holds last, grouped; each kind
under its own label.

The expected values are the facts written into the inputs below, by hand."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from offpath.compaction.facts.extraction import extract
from offpath.compaction.facts.patterns import find
from offpath.compaction.facts.pinning import pin
from offpath.compaction.facts.sections import PINNED_HEADING


def kinds(text):
    return {(v, k) for v, k, _ in find(text)}


def section(text):
    return text.split(PINNED_HEADING, 1)[1]


def test_an_ip_address_is_an_address_not_a_version():
    got = kinds("node 10.0.3.17:8080 and 192.168.1.4 run ledger v2.4.1 (2.4.1-rc1)")
    assert ("10.0.3.17:8080", "address") in got and ("192.168.1.4", "address") in got
    assert ("v2.4.1", "version") in got and ("2.4.1-rc1", "version") in got
    record = '{"host": "10.0.3.17", "image": "ledger v2.4.1", "note": "' + "x " * 200 + '"}'
    removed = [ToolMessage(id="t1", content=record, tool_call_id="c")]
    pinned = section(pin("s", removed, 300)[0])
    assert "- addresses: 10.0.3.17" in pinned and "- versions: v2.4.1" in pinned


def test_a_range_with_its_unit_is_one_fact():
    got = kinds("CPU held at 45-55% while memory stayed within 867-918m, p99 1.5–2.5 s")
    assert {("45-55%", "quantity"), ("867-918m", "quantity"), ("1.5–2.5 s", "quantity")} <= got


def test_a_name_the_agent_put_in_backticks_is_a_fact_it_stated():
    removed = [
        ToolMessage(id="t1", content="see `helper_text` in the docs", tool_call_id="c"),
        AIMessage(id="a1", content="The leak is in `build_index`, called by `minishop`."),
    ]
    facts = {f.value: f for f in extract(removed)}
    assert facts["build_index"].said and facts["minishop"].said
    assert "helper_text" not in facts  # a tool's output quoting code: not the agent's name


def session():
    """A user's request, a tool's log of request ids, times and URL paths, and the agent's
    conclusion in its own words."""
    log = "\n".join(
        f"2026-03-02T10:{k + 2:02d}:{(k * 7) % 60:02d}Z GET /api/cart/{4100 + k}/items "
        f"request_id={k:04x}9c3e{k:02d}d1aa trace 8fa{k:02d}c2e91b7d{k:02d} 200"
        for k in range(30)
    )
    return [
        HumanMessage(id="h1", content="Why is checkout slow? Keep the release-train-7 branch."),
        AIMessage(
            id="a0",
            content="",
            tool_calls=[{"id": "c1", "name": "logs", "args": {"service": "checkout"}}],
        ),
        ToolMessage(id="t1", content=log, tool_call_id="c1"),
        AIMessage(
            id="a1",
            content=(
                "CPU sits at 45-55% and memory at 867-918m, with no restarts; the slow path "
                "is `build_index`."
            ),
        ),
    ]


def test_what_the_agent_and_the_user_said_comes_before_what_a_tool_output_holds():
    for budget in (160, 300, 1_000):
        text, _ = pin("s", session(), budget)
        pinned = section(text)
        for value in ("45-55%", "867-918m", "build_index", "release-train-7"):
            assert value in pinned, (budget, value, pinned)
        assert len(text) - len("s") <= budget


def test_ids_and_times_only_a_tool_output_holds_are_grouped_not_listed():
    text, _ = pin("s", session(), 2_000)
    pinned = section(text)
    # the times as one range, the ids as a count with how to recall them
    assert "2026-03-02T10:02:00Z-10:31:23Z" in pinned, pinned
    assert "30 request ids" in pinned and 'recall("request_id")' in pinned, pinned
    # none of the thirty listed one by one
    assert "10:17:45Z" not in pinned and "000f9c3e15d1aa" not in pinned, pinned
    assert len(text) - len("s") <= 2_000


def test_an_id_the_agent_names_is_listed_though_a_tool_output_held_it_first():
    removed = [
        *session(),
        AIMessage(id="a2", content="The slow one was request 00079c3e07d1aa."),
    ]
    pinned = section(pin("s", removed, 600)[0])
    assert "00079c3e07d1aa" in pinned
    assert "29 request ids" in pinned


def test_over_many_compactions_every_span_keeps_a_share_of_the_pins():
    """Each compaction removes the last summary and a span of the agent's findings; the
    pins, too small for all of them, keep some of every span: none in the middle vanishes."""
    from offpath.compaction.summary.message import build_summary_message

    summary = None
    spans = 12
    for k in range(spans):
        said = AIMessage(
            id=f"a{k}",
            content="Found " + ", ".join(f"node-{k}x{j}" for j in range(6)) + " lagging.",
        )
        removed = [summary, said] if summary is not None else [said]
        text, _ = pin("s", removed, 420)
        assert len(text) - len("s") <= 420
        summary = build_summary_message(
            message_id=f"s{k}",
            summary_text=text,
            replaced_ids=[m.id for m in removed],
            replaced_chars=1_000,
            summarizer="generic",
            compactions=k + 1,
            request=None,
        )
    pinned = section(text)
    kept = [k for k in range(spans) if f"node-{k}x" in pinned]
    assert kept == list(range(spans)), pinned


def test_names_and_line_numbers_the_agent_writes_bare_are_facts_it_said():
    said = AIMessage(
        id="a1",
        content=(
            "The bug is in ForeignKey's handling of old_name in models.py: see "
            "pvsystem.PVSystem at line 222 and lines 341-343, e.g. the __init__ path."
        ),
    )
    tool = ToolMessage(
        id="t1",
        content="class ConfigMaps:\n    new_name = helpers.py  # line 17 of base.Thing",
        tool_call_id="c",
    )
    facts = {f.value: f for f in extract([tool, said])}
    for value in ("ForeignKey", "old_name", "models.py", "pvsystem.PVSystem", "__init__"):
        assert facts[value].said, value
    assert facts["line 222"].said and facts["lines 341-343"].said
    for value in ("ConfigMaps", "new_name", "helpers.py", "line 17", "base.Thing", "e.g"):
        assert value not in facts, value  # tool output's code, and prose


def summary_of(text, k=0, removed=()):
    from offpath.compaction.summary.message import build_summary_message

    return build_summary_message(
        message_id=f"s{k}",
        summary_text=text,
        replaced_ids=[m.id for m in removed] or ["x"],
        replaced_chars=1_000,
        summarizer="generic",
        compactions=k + 1,
        request=None,
    )


def test_what_the_agent_said_and_the_user_named_stay_so_when_a_summary_carries_them():
    more = AIMessage(id="a2", content="Also slow: " + ", ".join(f"`q_{k}_scan`" for k in range(80)))
    text, _ = pin("s", [*session(), more], 1_200)
    assert "- ids (said): q_0_scan, q_1_scan" in section(text), text
    facts = {f.value: f for f in extract([summary_of(text)])}
    for value in ("q_0_scan", "q_1_scan", "867-918m", "build_index"):
        assert facts[value].said and facts[value].carried, value
    # a line of values the user named reads back as asked
    named = f"s\n\n{PINNED_HEADING} (`recall` finds each):\n- ids (asked): release-train-7, OPS-12"
    facts = {f.value: f for f in extract([summary_of(named)])}
    assert facts["release-train-7"].asked and facts["OPS-12"].carried


def test_the_agent_said_values_are_listed_by_value_before_quoted_lines_and_arguments():
    """A section that cannot hold every fact lists what the agent said by value first: while
    some of them wait, its lines are not quoted (a quoted line costs a hundred chars for one
    or two of them, and a summary over its budget gives quoted lines up first)."""
    said = AIMessage(
        id="a9",
        content="Suspects: " + ", ".join(f"`shard_{k}_lag`" for k in range(60)) + ".",
    )
    calls = [
        AIMessage(
            id=f"c{k}",
            content="",
            tool_calls=[{"id": f"k{k}", "name": "get", "args": {"pod": f"ledger-{k}-x7f2"}}],
        )
        for k in range(20)
    ]
    text, _ = pin("s", [*calls, said], 1_000)
    listed = "\n".join(
        ln for ln in section(text).splitlines() if ln.startswith("- ") and "`" not in ln
    )
    shown = [k for k in range(60) if f"shard_{k}_lag" in section(text)]
    assert len(shown) >= 40 and all(f"shard_{k}_lag" in listed for k in shown), text
    assert "(a9" not in text  # its line is not quoted while some of its values wait


def test_a_summary_over_its_budget_gives_up_said_values_one_at_a_time_every_span_keeping_some():
    from offpath.compaction.budget import fit_summary

    spans = "; ".join(", ".join(f"fact-{k}-{j}" for j in range(8)) for k in range(6))
    content = (
        "[Context from earlier in this session, summarized]\n\n"
        "**Investigating:** the ledger lag\n\n"
        f"{PINNED_HEADING} (`recall` finds each):\n"
        f"- names (said): {spans}\n"
        "- ids: " + ", ".join(f"tool-id-{k}x" for k in range(20))
    )
    cap = len(content) - 500
    fitted = fit_summary(content, cap)
    assert len(fitted) <= cap
    assert "tool-id-" not in fitted  # the identifiers only a tool held went first
    line = next(ln for ln in fitted.splitlines() if ln.startswith("- names (said): "))
    groups = line.split(": ", 1)[1].split("; ")
    assert len(groups) == 6 and all(g for g in groups), line
    counts = [len(g.split(", ")) for g in groups]
    assert max(counts) - min(counts) <= 1 and sum(counts) < 48, counts
