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
    from offpath.compaction.summary import build_summary_message

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


def test_a_value_that_ends_a_sentence_is_a_fact_as_it_is_inside_one():
    """A period after a value ends the sentence: the value is found as without it (a dot
    followed by more of the value, as in a decimal or a file name, is not an end)."""
    sentences = {
        "So PVSystem.__init__ starts at line 194.": ("line 194", "line"),
        "The leak came with 2.3.1.": ("2.3.1", "version"),
        "It was fixed in v1.2.": ("v1.2", "version"),
        "Tracked as PROJ-123.": ("PROJ-123", "ticket"),
        "Booked item 1008292230.": ("1008292230", "number"),
        "Ready replicas were 3/4.": ("3/4", "quantity"),
    }
    for text, fact in sentences.items():
        assert fact in kinds(text), text
        assert fact in kinds(text[:-1] + " now"), text  # the same value mid-sentence
    marked = {  # a colon that introduces what follows, markdown's bold
        "Booked item 1008292230: two bags": ("1008292230", "number"),
        "The node 10.0.3.17: down since noon": ("10.0.3.17", "address"),
        "The dashboard **https://grafana.example.com/d/api** shows it": (
            "https://grafana.example.com/d/api",
            "url",
        ),
    }
    for text, fact in marked.items():
        assert fact in kinds(text), text
    assert ("line 194", "line") not in kinds("see line 194.5")
    assert ("PROJ-123", "ticket") not in kinds("see PROJ-123.md")
    said = AIMessage(id="a1", content="The check is on line 253. Pinned to 2.3.1.")
    facts = {f.value: f for f in extract([said])}
    assert facts["line 253"].said and facts["2.3.1"].said


def test_a_word_the_agent_writes_with_letters_then_a_digit_is_a_name_it_said():
    said = AIMessage(id="a1", content="Let me install h5py: the hashes are sha256, not md5.")
    tool = ToolMessage(id="t1", content="Collecting h5py\nusing utf8 locale", tool_call_id="c")
    facts = {f.value: f for f in extract([tool, said])}
    assert facts["h5py"].said and facts["sha256"].said
    assert "md5" not in facts  # three chars: a word, not a name
    assert "utf8" not in facts  # only tool output writes it: its prose is not read for names
    assert not kinds("the 2nd try, then 3rd")  # a number first: an ordinal
    assert not kinds("built from g3f2a9c1")  # digits between letters again: an id, not a name


def summary_of(text, k=0, removed=()):
    from offpath.compaction.summary import build_summary_message

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
    said = [ln for ln in section(text).splitlines() if ln.startswith("- ids (said): ")]
    assert said and "q_12_scan, q_13_scan" in said[0], text
    facts = {f.value: f for f in extract([summary_of(text)])}
    for value in ("q_12_scan", "q_13_scan", "867-918m", "build_index"):
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


def test_a_line_of_other_values_over_the_budget_gives_up_one_value_at_a_time():
    """A summary a few chars over its budget loses a few of the values only a tool held, not
    the whole line of them (a line of forty values dropped for sixty chars)."""
    from offpath.compaction.budget import fit_summary

    tool_ids = [f"tool-id-{k}x" for k in range(20)]
    content = (
        "[Context from earlier in this session, summarized]\n\n"
        "**Investigating:** the ledger lag\n\n"
        f"{PINNED_HEADING} (`recall` finds each):\n"
        "- names (said): shard_1_lag, shard_2_lag\n"
        "- ids: " + ", ".join(tool_ids[:10]) + "; " + ", ".join(tool_ids[10:])
    )
    cap = len(content) - 60
    fitted = fit_summary(content, cap)
    assert len(fitted) <= cap
    assert "- names (said): shard_1_lag, shard_2_lag" in fitted
    kept = [v for v in tool_ids if v in fitted]
    assert 14 <= len(kept) < 20, fitted
    line = next(ln for ln in fitted.splitlines() if ln.startswith("- ids: "))
    assert all(line.split(": ", 1)[1].split("; ")), line  # each span keeps some


def test_a_summary_over_its_budget_gives_up_the_longest_said_values_first():
    """Freeing chars, a summary gives up the dearest of what the agent said first: a 40-char
    pod name frees the room of four 8-char figures, so fewer facts go; every span keeps
    some of each line."""
    from offpath.compaction.budget import fit_summary

    # the line of figures is the longer one: 72 figures, 12 pod names
    figures = [[f"{100 + 20 * k + j} Mi" for j in range(12)] for k in range(6)]
    pods = [[f"checkout-api-{k}{j}-7f9c4d8b6-x2k9p-ledger" for j in range(2)] for k in range(6)]
    content = (
        "[Context from earlier in this session, summarized]\n\n"
        "**Investigating:** the memory limits\n\n"
        f"{PINNED_HEADING} (`recall` finds each):\n"
        "- amounts (said): " + "; ".join(", ".join(g) for g in figures) + "\n"
        "- ids (said): " + "; ".join(", ".join(g) for g in pods)
    )
    cap = len(content) - 150  # about four of the pod names
    fitted = fit_summary(content, cap)
    assert len(fitted) <= cap
    assert all(v in fitted for g in figures for v in g), fitted  # no figure went
    line = next(ln for ln in fitted.splitlines() if ln.startswith("- ids (said): "))
    groups = line.split(": ", 1)[1].split("; ")
    assert len(groups) == 6 and all(groups), line  # each span keeps some of its pods
    assert sum(v in fitted for g in pods for v in g) >= 12 - 5, fitted


def test_a_summarys_place_reads_back_as_said_its_findings_as_stated_its_quotes_as_data():
    """The next summary ranks the agent's place an earlier one kept (its request, state,
    plan: their words) with what the agent said, so it is not outranked by the values still
    listed as said once those lines are rewritten; its findings in words with what the agent
    relied on; a line it quotes from tool output stays data, and offpath's own words (a note
    in italics, a section left out for space) are no fact."""
    text = "\n".join(
        [
            "**Investigating:** why `ledger-api` is slow",
            "**Key findings:**",
            "- the agent found `shard_7_lag` at 867-918m",
            "- `Replicas: 0 available | pod ledger-7f9c2-x1` (kubectl_describe output)",
            "**Ruled out:** (left out for space; `recall` finds it)",
            "**Current state:** checking `build_index` next",
            "",
            "_Offline summary (no LLM): lines taken from the messages._",
        ]
    )
    facts = {f.value: f for f in extract([summary_of(text)])}
    for value in ("ledger-api", "build_index"):
        assert facts[value].said and facts[value].carried, value
    for value in ("shard_7_lag", "867-918m"):
        assert facts[value].stated and not facts[value].said and facts[value].carried, value
    assert facts["ledger-7f9c2-x1"].carried and not facts["ledger-7f9c2-x1"].stated
    assert "recall" not in facts and "messages._" not in facts, sorted(facts)


def test_the_index_names_topics_the_rest_of_the_summary_does_not_hold():
    from offpath.compaction.index import span_line

    removed = [
        HumanMessage(id="h1", content="Why is `ledger-api` slow?"),
        AIMessage(
            id="a1",
            content="Suspects: `shard_1_lag`, `shard_2_lag`, `build_index` and `fetch_rows`.",
        ),
    ]
    every = span_line(removed, 0)
    assert every is not None and "shard_1_lag" in every and "build_index" in every
    line = span_line(removed, 0, shown="- names (said): shard_1_lag, build_index")
    assert line is not None
    topics = line.split("; topics: ", 1)[1].split(", ")
    assert "shard_1_lag" not in topics and "build_index" not in topics, line
    assert "shard_2_lag" in topics and "fetch_rows" in topics, line


def test_the_since_sections_said_values_stay_while_the_other_values_give_way():
    """The since-section lists the facts of the messages that went at the apply, which no
    summary read: what the agent said there is its newest words, kept with the pins' said
    values, while the values only a tool held (there and under the pins) go first."""
    from offpath.compaction.budget import fit_summary
    from offpath.compaction.facts.sections import SINCE_HEADING

    content = "\n".join(
        [
            "[Context from earlier in this session, summarized]",
            "",
            "**Investigating:** the ledger lag",
            "",
            f"{PINNED_HEADING} (`recall` finds each):",
            "- names (said): shard_1_lag, shard_2_lag",
            "- ids: " + ", ".join(f"pin-id-{k}x" for k in range(12)),
            "",
            f"{SINCE_HEADING} (3 later messages, not summarized yet; their facts, by message):",
            '- Request (answered): "Go on" (recall("h9"))',
            "- names (said): shard_9_lag, build_index_v2",
            "- ids: " + ", ".join(f"since-id-{k}x" for k in range(12)),
        ]
    )
    fitted = fit_summary(content, len(content) - 200)
    assert len(fitted) <= len(content) - 200
    for value in ("shard_1_lag", "shard_2_lag", "shard_9_lag", "build_index_v2"):
        assert value in fitted, fitted
    assert '- Request (answered): "Go on" (recall("h9"))' in fitted
    assert "since-id-" not in fitted and "pin-id-" in fitted, fitted  # the since-section's first


def test_the_since_section_lists_what_the_agent_said_on_a_line_of_its_own_on_any_budget():
    said = AIMessage(
        id="a5", content="Lagging: " + ", ".join(f"`shard_{k}_lag`" for k in range(40)) + "."
    )
    text, _ = pin("", [said], 400, header="**Since**:", stated_lines=True)
    assert "\n- ids (said): shard_0_lag, shard_1_lag" in text, text
    small, _ = pin("", [said], 400, header="**Since**:")
    assert "(said)" not in small and "\n- ids: shard_0_lag" in small, small  # a small budget


def test_a_quote_at_the_swap_is_a_short_clip_around_its_identifier():
    """The check before the swap quotes where an identifier came from in a short clip (its
    message cited: ``recall`` reads it whole), not the long line it was found on."""
    from offpath.compaction.facts.pinning import SWAP_LINE_CHARS, swap_check

    filler = " ".join(f"word{k}" for k in range(40))
    removed = [ToolMessage(id="t7", content=f"{filler} ord-77x shipped {filler}", tool_call_id="c")]
    later = [HumanMessage(id="h8", content="What happened to ord-77x?")]
    section_text, missing = swap_check(later, removed, [], "", 1_000)
    assert missing == 0 and "ord-77x" in section_text, section_text
    quoted = [ln for ln in section_text.splitlines() if ln.startswith("- `")]
    assert len(quoted) == 1, section_text
    assert len(quoted[0].split("` (", 1)[0]) <= SWAP_LINE_CHARS + 3, quoted


def test_the_swap_quotes_the_newest_line_and_none_the_later_messages_hold_themselves():
    from offpath.compaction.facts.pinning import swap_check

    removed = [
        ToolMessage(id="t1", content="ord-77x created by batch 4", tool_call_id="c1"),
        ToolMessage(id="t2", content="ord-77x shipped to depot-9", tool_call_id="c2"),
        HumanMessage(id="h3", content="Steps:\nds.rows_x = 5\nthen run it"),
    ]
    later = [
        HumanMessage(id="h8", content="What happened to ord-77x?"),
        HumanMessage(id="h9", content="Steps:\nds.rows_x = 5\nthen run it again"),
    ]
    section_text, missing = swap_check(later, removed, [], "", 1_000)
    assert missing == 0
    assert "ord-77x shipped to depot-9" in section_text and "(t2)" in section_text
    assert "(t1)" not in section_text, section_text
    assert "ds.rows_x" not in section_text, section_text  # the task sent again holds it


def test_a_quoted_line_carried_for_three_compactions_gives_way_its_values_listed():
    from offpath.compaction.facts.pinning import QUOTED_AGE_MAX

    line = "- `The culprit is ledger-db-3 (INC-4821), seen at 10:31:07Z.` (a1; said; age {})"

    def carried(age):
        text = f"s\n\n{PINNED_HEADING} (`recall` finds each):\n{line.format(age)}"
        return section(pin("s2", [summary_of(text)], 2_000)[0])

    young = carried(QUOTED_AGE_MAX - 1)
    assert f"(a1; said; age {QUOTED_AGE_MAX})" in young, young
    old = carried(QUOTED_AGE_MAX)
    assert "The culprit is" not in old, old  # not quoted a fourth time
    listed = [ln for ln in old.splitlines() if ln.startswith("- ids (said): ")]
    assert listed and "ledger-db-3" in listed[0] and "INC-4821" in listed[0], old


def test_on_a_large_budget_what_the_agent_said_stays_listed_beside_its_quoted_line():
    # a summary over its budget gives up quoted lines first: the values the next summary
    # reads back as said are those listed, not those a dropped line held
    said = AIMessage(id="a1", content="Root cause: pool exhausted on db-primary-2 (INC-4821).")
    pinned = section(pin("s", [said], 2_000)[0])
    assert "(a1; said)" in pinned
    assert "- ids (said): INC-4821, db-primary-2" in pinned, pinned


def test_what_the_agent_said_that_cannot_all_fit_lists_the_shorter_values_first():
    # the same room holds more of them: a 6-char figure costs what a 40-char pod name does
    # not (each span keeps its turn)
    long = [f"checkout-api-deployment-{k}-7f9c4d8b6-x2k9p" for k in range(12)]
    said = AIMessage(
        id="a1",
        content="Pods "
        + ", ".join(f"`{p}`" for p in long)
        + " use "
        + ", ".join(f"{500 + k} Mi" for k in range(12))
        + ".",
    )
    pinned = section(pin("s", [said], 320)[0])
    figures = [k for k in range(12) if f"{500 + k} Mi" in pinned]
    names = [p for p in long if p in pinned]
    assert len(figures) == 12, pinned
    assert len(figures) + len(names) > 12


def test_the_swap_quotes_one_line_per_message_and_lists_its_other_identifiers():
    """A listing that later messages name row by row costs one quoted line for its message
    (where they came from) and one line of values, not a line per row."""
    from offpath.compaction.facts.pinning import swap_check

    rows = "\n".join(f"default pod-{k}x7-abc 8{k}0 Mi" for k in range(12))
    removed = [ToolMessage(id="t1", content=rows, tool_call_id="c1")]
    named = ", ".join(f"`pod-{k}x7-abc`" for k in range(12))
    later = [AIMessage(id="a9", content=f"The largest are {named}.")]
    section_text, missing = swap_check(later, removed, [], "", 2_000)
    assert missing == 0
    entries = section_text.splitlines()[1:]
    assert len(entries) == 2, section_text
    assert entries[0].startswith("- `default pod-") and entries[0].endswith("(t1)")
    assert entries[1].startswith("- also in t1: ")
    assert all(f"pod-{k}x7-abc" in section_text for k in range(12))


def test_the_swap_lists_an_identifier_found_only_in_offpaths_own_note():
    from offpath.compaction.facts.pinning import swap_check

    note = "head\n[offpath: 900 of this result's 1,000 chars are not shown; Facts in it: 'zq-881'.]"
    removed = [ToolMessage(id="t1", content=note, tool_call_id="c1")]
    later = [HumanMessage(id="h9", content="What about zq-881?")]
    section_text, missing = swap_check(later, removed, [], "", 1_000)
    assert missing == 0 and section_text.splitlines()[1:] == ["- also in t1: zq-881"]


def test_the_swap_lists_what_only_an_earlier_summarys_own_text_held_without_quoting_it():
    """An earlier summary's line (its agent's place, its findings) is offpath's words citing
    the summary itself: the identifier is listed by value, its line not quoted."""
    from offpath.compaction.facts.pinning import swap_check
    from offpath.compaction.summary import cite

    earlier = summary_of(
        "**Investigating:** x\n**Current state:** the graph is drawn. Last tool call: "
        '`query_metrics({"query": "avg:kube.mem{pod:zq-881}"})`.'
    )
    later = [HumanMessage(id="h9", content="What about zq-881?")]
    section_text, missing = swap_check(later, [earlier], [], "", 1_000)
    assert missing == 0
    assert section_text.splitlines()[1:] == [f"- also in {cite(str(earlier.id))}: zq-881"], (
        section_text
    )


def test_what_a_pasted_document_names_is_not_ranked_as_asked():
    """A user message of a request's size names what the user asks about; a document it
    pastes (a demonstration, a log) is material, its values not the user's own."""
    from offpath.compaction.facts.extraction import DOCUMENT_MIN_CHARS

    ask = HumanMessage(id="h1", content="Please rebook reservation QX7ZP2 on flight HAT204.")
    pasted = HumanMessage(
        id="h2",
        content="Here is an example session:\n"
        + "the agent opened `fields.py` at line 1474 and ran reproduce.py\n"
        * (DOCUMENT_MIN_CHARS // 60 + 1),
    )
    facts = {f.value: f for f in extract([ask, pasted])}
    assert facts["QX7ZP2"].asked and facts["HAT204"].asked
    assert not facts["fields.py"].asked and not facts["line 1474"].asked


def test_a_tools_name_is_not_pinned_unless_the_agent_names_it_in_its_words():
    call = AIMessage(
        id="a1",
        content="",
        tool_calls=[{"name": "get_reservation_details", "args": {"id": "QX7ZP2"}, "id": "c1"}],
    )
    result = ToolMessage(
        id="t1", content='{"reservation_id": "QX7ZP2", "flight": "HAT204"}', tool_call_id="c1"
    )

    def listed(pinned):  # the lines of values (not the quoted lines)
        return "\n".join(ln for ln in pinned.splitlines() if not ln.startswith("- `"))

    pinned = section(pin("s", [call, result], 1_200)[0])
    assert "QX7ZP2" in listed(pinned) and "get_reservation_details" not in listed(pinned), pinned
    said = AIMessage(id="a2", content="I used `get_reservation_details` for QX7ZP2.")
    pinned = section(pin("s", [call, result, said], 1_200)[0])
    assert "- names (said): get_reservation_details" in pinned, pinned


def test_a_value_held_only_inside_a_longer_name_is_still_pinned():
    """``loki`` inside ``loki-0`` (listed) or ``loki-chunks-cache`` (a kept tool output)
    names another thing: the namespace the agent named stays pinned, as does what a summary
    carried."""
    import re

    def alone(value, text):
        return re.search(rf"(?<![\w.-]){re.escape(value)}(?![\w-])", text) is not None

    kept = [ToolMessage(id="t9", content="loki-chunks-cache memcached-0 Running", tool_call_id="c")]
    said = AIMessage(id="a1", content="The `loki` namespace runs `loki-0`; `memcached` too.")
    pinned = section(pin("s", [said], 1_000, kept)[0])
    assert all(alone(v, pinned) for v in ("loki", "loki-0", "memcached")), pinned
    # carried by a summary: the next one keeps them though the kept part (and the value
    # listed beside) holds longer names that start with them
    listed = "- names (said): loki, loki-0, memcached"
    carried = summary_of(f"s\n\n{PINNED_HEADING} (`recall` finds each):\n{listed}")
    again = section(pin("s2", [carried], 1_000, kept)[0])
    assert all(alone(v, again) for v in ("loki", "loki-0", "memcached")), again


def test_what_the_agent_said_stays_pinned_while_only_a_kept_tool_output_holds_it():
    """A kept tool output holding a value the agent said goes at a later compaction, and tool
    output is not read for names: unpinned now, the value would go with it. A value the
    agent's kept words hold is in view and read again when they go."""
    listed = "- names (said): arrays, PVSystem"
    carried = summary_of(f"s\n\n{PINNED_HEADING} (`recall` finds each):\n{listed}")
    kept = [
        ToolMessage(
            id="t9", content="def __init__(self, arrays=None, name=None):", tool_call_id="c"
        ),
        AIMessage(id="a2", content="Next I check `PVSystem` in the docs."),
    ]
    text = pin("s2", [carried], 1_000, kept)[0]
    assert PINNED_HEADING in text, text  # on its own line, not "held" by the tool output
    pinned = section(text)
    assert "arrays" in pinned, pinned  # only the tool output kept holds it
    assert "PVSystem" not in pinned, pinned  # the agent's kept words hold it


def test_a_value_held_only_where_the_next_reading_does_not_find_it_stays_pinned():
    """A word that is a fact only in backticks, as a tool's argument or as a value the user
    asked about (``arrays``, ``PVSystem``) is not held by a summary or kept words that write
    it bare: the next compaction reads them as prose and the value would be gone. Written
    so that it is read again (in backticks; a name with a shape of its own bare), it is."""
    listed = "- names (said): arrays, PVSystem, old_name\n- ids (asked): Mugikah"
    carried = summary_of(f"s\n\n{PINNED_HEADING} (`recall` finds each):\n{listed}")
    bare = "Creates two arrays; PVSystem and Mugikah are next; old_name is renamed."
    for summary, kept in ((bare, []), ("s2", [AIMessage(id="a2", content=bare)])):
        pinned = section(pin(summary, [carried], 1_000, kept)[0])
        for value in ("arrays", "PVSystem", "Mugikah"):
            assert value in pinned, (summary, pinned)
        assert "old_name" not in pinned, (summary, pinned)  # snake_case: a fact read bare
    held = "Creates two `arrays`; `PVSystem` and `Mugikah` are next; old_name is renamed."
    assert pin(held, [carried], 1_000)[0] == held  # nothing missing: no section


def test_what_the_agent_just_said_is_pinned_while_only_a_kept_tool_output_holds_it():
    """The same for a value the agent said in the removed part: a kept tool output that
    echoes it (the file it just edited) is shortened or goes at a later compaction, unread
    for names, and the value with it. Pinned now; a value the agent's kept words hold is in
    view and is not."""
    removed = [
        AIMessage(
            id="a1",
            content="I will exclude 'PixelRepresentation' from the required elements when "
            "'FloatPixelData' or 'DoubleFloatPixelData' is present.\n"
            "The check is in `numpy_handler.py`.",
        )
    ]
    kept = [
        ToolMessage(
            id="t9",
            content="41: if 'FloatPixelData' in ds or 'DoubleFloatPixelData' in ds:\n"
            "42:     required.remove('PixelRepresentation')",
            tool_call_id="c",
        ),
        AIMessage(id="a2", content="Now I run the tests for `numpy_handler.py`."),
    ]
    pinned = section(pin("s", removed, 1_000, kept)[0])
    for value in ("PixelRepresentation", "FloatPixelData", "DoubleFloatPixelData"):
        assert value in pinned, (value, pinned)  # only the kept tool output holds it
    assert "numpy_handler.py" not in pinned, pinned  # the agent's kept words hold it


def test_a_directory_is_held_by_a_path_it_starts_a_name_is_not_by_a_longer_name():
    from offpath.compaction.facts.patterns import stands_in

    assert stands_in("/srv/app/", "see /srv/app/main.py")  # its last edge is no letter
    assert not stands_in("loki", "see loki-0") and not stands_in("api", "checkout-api up")
    assert stands_in("loki", "the loki namespace") and stands_in("5m", "rate[5m]")


def test_what_the_agent_said_that_an_earlier_compaction_lost_is_pinned_before_tool_output():
    """Values the agent said that earlier compactions took out of view (their loss reports),
    which the removed part no longer holds, take the room before identifiers only a tool output
    holds; one the kept messages hold, or one only a tool output held, is not pinned again."""
    from offpath.compaction.facts.extraction import Fact

    out = "\n".join(
        f"ERROR volume /srv/data/shard-{k}/wal.log on host node-{k}-east failed" for k in range(40)
    )
    removed = [ToolMessage(id="t1", content=out, tool_call_id="c")]
    kept = [AIMessage(id="a9", content="Still looking at `wal_rotate`.")]

    def lost(value, age, said=True):
        return Fact(value, "name", "a0", "", stated=said, said=said, carried=True, age=age)

    gone = [
        lost("ledger_sync", 3),
        lost("flush_batch", 2),
        lost("wal_rotate", 1),
        lost("tool_only_9x", 1, said=False),
    ]
    for budget in (200, 1_200):
        before = section(pin("s", removed, budget, kept)[0])
        assert "ledger_sync" not in before
        text, _ = pin("s", removed, budget, kept, lost=gone)
        pinned = section(text)
        assert "ledger_sync" in pinned and "flush_batch" in pinned, pinned
        assert "wal_rotate" not in pinned and "tool_only_9x" not in pinned, pinned
        # the room they took was that of what only the tool output held
        tool_values = [f"node-{k}-east" for k in range(40)]
        assert sum(v in pinned for v in tool_values) < sum(v in before for v in tool_values)
        assert len(text) - len("s") <= budget
    assert "- names (said): ledger_sync; flush_batch" in pinned, pinned
