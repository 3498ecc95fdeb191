"""The loss report of a compaction (issue 19): what left the model's view and which of its
facts neither the summary nor the kept part holds; pure (:mod:`offpath.compaction.loss`),
and as the apply paths make it from a fitted compaction
(:func:`offpath.coordination.writers.with_loss`)."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.graph.message import add_messages

from offpath.compaction.accounting import content_text, message_chars
from offpath.compaction.loss import MAX_LISTED, loss_report
from offpath.compaction.patch import Prepared, fit
from offpath.compaction.planner import plan_compaction
from offpath.compaction.shorten import shorten
from offpath.config import load_settings
from offpath.coordination.writers import with_loss


def call(mid: str, cid: str, **args: str) -> AIMessage:
    return AIMessage(id=mid, content="", tool_calls=[{"id": cid, "name": "kubectl", "args": args}])


def removed_part() -> list:
    return [
        HumanMessage(id="h1", content="why does checkout-api restart? ticket OPS-4711"),
        call("a1", "c1", cmd="describe pod checkout-api-7f9c4-x450"),
        ToolMessage(
            id="t1",
            tool_call_id="c1",
            content="State: OOMKilled\nLast commit 9f3e2a1c\nconfig /etc/checkout/pool.yaml",
        ),
        AIMessage(id="a2", content="The pod checkout-api-7f9c4-x450 was OOMKilled."),
    ]


def test_facts_in_neither_the_summary_nor_the_kept_part_are_lost_with_their_message():
    kept = [HumanMessage(id="h2", content="and what about 9F3E2A1C?")]  # another case
    report = loss_report(removed_part(), "Investigated OPS-4711 (OOMKilled).", kept)
    lost = {f.value: f for f in report.lost}
    assert "/etc/checkout/pool.yaml" in lost and lost["/etc/checkout/pool.yaml"].message_id == "t1"
    assert "checkout-api-7f9c4-x450" in lost and lost["checkout-api-7f9c4-x450"].message_id == "a1"
    assert "OPS-4711" not in lost and "OOMKilled" not in lost  # the summary holds them
    assert "9f3e2a1c" not in lost  # the kept part holds it (case aside)
    assert report.facts_lost == len(report.lost) < report.facts
    assert report.messages_removed == 4
    assert report.chars_removed == sum(message_chars(m) for m in removed_part())


def test_a_fact_in_a_kept_tool_call_argument_is_not_lost():
    kept = [call("a3", "c3", path="/etc/checkout/pool.yaml")]
    report = loss_report(removed_part(), "", kept)
    assert "/etc/checkout/pool.yaml" not in {f.value for f in report.lost}


def test_nothing_is_lost_when_the_summary_names_every_fact():
    removed = removed_part()
    everything = loss_report(removed, "", [])
    summary = " ".join(f.value for f in everything.lost)
    assert everything.facts_lost == everything.facts > 0
    report = loss_report(removed, summary, [])
    assert report.facts == everything.facts and report.facts_lost == 0 and report.lost == ()


def test_what_a_shortened_kept_result_cut_counts_too():
    dump = "\n".join(
        f"ERROR payments-gw txn-{100_000 + k} declined by issuer BANK-{k % 97:02d}"
        for k in range(3_000)
    )
    before = ToolMessage(id="t9", tool_call_id="c9", content=dump)
    after = shorten(before, 2_000)
    report = loss_report([], "", [after], shortened=[(before, after)])
    assert report.results_shortened == 1
    assert report.chars_shortened == message_chars(before) - message_chars(after) > 0
    kept_text = content_text(after.content)
    assert report.facts_lost > 1_000 and len(report.lost) == MAX_LISTED
    for fact in report.lost:  # cut out of the result, and not among what its copy lists
        assert fact.value in dump and fact.value not in kept_text and fact.message_id == "t9"


def test_ground_truth_is_checked_among_what_left_the_view_only():
    report = loss_report(
        removed_part(),
        "OPS-4711",
        [],
        ground_truth=["OPS-4711", "pool.yaml", "#W2378156", "pool.yaml", ""],
    )
    assert report.ground_truth == (2, ("pool.yaml",))  # #W2378156 never was in the removed part
    assert loss_report(removed_part(), "", []).ground_truth is None
    assert report.to_json()["ground_truth"] == {"facts": 2, "lost": ["pool.yaml"]}


def test_the_list_is_bounded_and_the_count_is_not():
    removed = [
        ToolMessage(id=f"t{k}", tool_call_id=f"c{k}", content=f"host db-replica-{k:03d} down")
        for k in range(MAX_LISTED + 30)
    ]
    report = loss_report(removed, "", [])
    assert report.facts_lost == MAX_LISTED + 30 and len(report.lost) == MAX_LISTED


def thread() -> list:
    messages: list = [SystemMessage(id="sys", content="You are an SRE agent.")]
    for k in range(12):
        messages += [
            HumanMessage(
                id=f"h{k}", content=f"check shard {k} of ledger-db (ticket OPS-{900 + k})"
            ),
            call(f"a{k}", f"c{k}", cmd=f"logs ledger-db-shard-{k}"),
            ToolMessage(
                id=f"t{k}",
                tool_call_id=f"c{k}",
                content=f"ledger-db-shard-{k}: replication lag {k * 10}s\n" + "ok\n" * 400,
            ),
            AIMessage(id=f"r{k}", content=f"Shard {k} lags {k * 10}s."),
        ]
    return messages


def test_the_apply_paths_record_it_from_the_fitted_compaction():
    settings = load_settings(summarization_threshold_chars=8_000, summarization_keep_chars=3_000)
    messages = thread()
    plan = plan_compaction(messages, settings)
    assert not hasattr(plan, "reason"), plan
    prepared = Prepared.from_plan(
        plan, job_id="j1", summary_text="Checked shards; OPS-900 open.", summarizer="t", model="m"
    )
    fitted = fit(prepared, messages)
    assert not hasattr(fitted, "reason"), fitted
    record = with_loss(fitted, messages, ground_truth=["ledger-db-shard-0", "OPS-900"])
    loss = record["loss"]
    assert {k: record[k] for k in fitted.record} == fitted.record  # the record, plus its loss
    assert loss["messages_removed"] == record["messages_removed"]
    assert loss["chars_removed"] == record["chars_removed"]
    after = add_messages(messages, fitted.patch)
    visible = content_text(fitted.summary.content) + " ".join(
        str(m.content) for m in after if m.id != fitted.summary.id
    )
    assert loss["lost"] and all(f["value"] not in visible for f in loss["lost"])
    assert all(f["message_id"] in fitted.removed for f in loss["lost"])
    assert loss["ground_truth"]["facts"] == 2
    assert "OPS-900" not in loss["ground_truth"]["lost"]  # the summary names it


def test_a_report_that_cannot_be_made_never_stops_the_compaction():
    settings = load_settings(summarization_threshold_chars=8_000, summarization_keep_chars=3_000)
    messages = thread()
    plan = plan_compaction(messages, settings)
    prepared = Prepared.from_plan(plan, job_id="j1", summary_text="s", summarizer="t", model="m")
    fitted = fit(prepared, messages)
    record = with_loss(fitted, messages, ground_truth=[object()])  # type: ignore[list-item]
    assert set(record["loss"]) == {"error"} and record["summary_id"] == fitted.record["summary_id"]


def ranked_removed_part() -> list:
    """A removed part where the agent concluded in its own words, the user fixed a value, and
    a tool output held request ids and timestamps no one used."""
    log_lines = "\n".join(
        f"2026-03-02T10:0{k}:11Z GET /api/orders request_id=req-{k}a9f3c2e1d4b5{k} 200"
        for k in range(8)
    )
    return [
        HumanMessage(id="h1", content="Do not touch `pool.yaml`; keep max_conns=200 (CHK-2291)."),
        call("a1", "c1", cmd="logs checkout-api"),
        ToolMessage(id="t1", tool_call_id="c1", content=log_lines),
        AIMessage(id="a2", content="p99 rose to 867-918ms after `retry_budget` dropped to 3."),
    ]


def test_the_agent_and_user_stated_facts_are_counted_apart_from_tool_only_identifiers():
    report = loss_report(ranked_removed_part(), "", [])
    by_value = {f.value: f for f in report.lost}
    # what the agent and the user stated, lost from view, listed first, each recallable
    stated = [f for f in report.lost if f.stated]
    assert {"867-918ms", "retry_budget", "pool.yaml", "max_conns=200"} <= set(by_value)
    assert report.lost[: len(stated)] == tuple(stated)
    assert all(f.recallable for f in report.lost)
    assert report.stated_lost == len(stated) == report.stated_facts
    # identifiers only the tool output held: counted apart, not among the stated losses
    tool_only = [f for f in report.lost if not f.stated]
    assert tool_only and report.tool_only_lost == report.tool_only_facts >= len(tool_only)
    assert all(f.message_id == "t1" for f in tool_only)
    assert report.stated_facts + report.tool_only_facts == report.facts
    assert report.stated_lost + report.tool_only_lost == report.facts_lost
    out = report.to_json()
    assert out["stated"] == {
        "facts": report.stated_facts,
        "lost": report.stated_lost,
        "recallable": report.stated_lost,
    }
    assert out["tool_only"] == {
        "facts": report.tool_only_facts,
        "lost": report.tool_only_lost,
        "recallable": report.tool_only_lost,
    }
    assert {"value", "kind", "message_id", "stated", "recallable"} <= set(out["lost"][0])


def test_a_stated_fact_the_summary_keeps_is_not_lost_and_tool_ids_do_not_count_as_stated():
    summary = "Kept `pool.yaml`, max_conns=200 (CHK-2291); p99 867-918ms; `retry_budget` 3 (checkout-api)."
    report = loss_report(ranked_removed_part(), summary, [])
    assert report.stated_lost == 0 < report.stated_facts
    assert report.tool_only_lost > 0 and all(not f.stated for f in report.lost)


def test_the_session_page_counts_the_stated_facts_lost_and_the_tool_only_ones_apart():
    from datetime import UTC, datetime

    from offpath.api.session_jobs import job_json
    from offpath.api.ui import templates
    from offpath.stores.db.tables import JobStatus

    loss = loss_report(ranked_removed_part(), "", []).to_json()
    now = datetime(2026, 1, 1, tzinfo=UTC)
    row = {
        "job_id": "j1",
        "status": JobStatus.APPLIED,
        "reason": None,
        "reason_code": None,
        "attempts": 1,
        "published": True,
        "chars_before": 5_000,
        "chars_at_apply": 5_000,
        "result": {"record": {"messages_removed": 4, "chars_removed": 900, "loss": loss}},
        "created_at": now,
        "updated_at": now,
    }
    job = {**job_json(row), "took_s": 1.0, "revertible": False, "forced": False}
    page = templates.env.get_template("_jobs.html").render(jobs=[job], session_id="s")
    stated, tool_only = loss["stated"], loss["tool_only"]
    assert f'data-stated-lost="{stated["lost"]}"' in page
    assert (
        f"{stated['lost']} of {stated['facts']} facts the agent or the user stated left the "
        f"model's view ({stated['recallable']} recallable)"
    ) in page
    assert f"{tool_only['lost']} of {tool_only['facts']} identifiers only tool output held" in page
    assert page.count('class="stated"') == stated["lost"]
    assert "tool output only" in page


def test_a_lost_value_is_recallable_when_any_original_holds_it_word_for_word():
    # a tool call's arguments are archived as JSON, a tab in a value escaped: the call does
    # not hold the value word for word; a later message quoting it does
    value = "#W23\t78156"
    alone = [HumanMessage(id="h1", content="look up the order"), call("a1", "c1", order=value)]
    quoted = [*alone, AIMessage(id="a2", content=f"Order {value} is late.")]
    lost = {f.value: f for f in loss_report(alone, "", []).lost}
    assert lost[value].message_id == "a1" and not lost[value].recallable
    lost = {f.value: f for f in loss_report(quoted, "", []).lost}
    assert lost[value].message_id == "a1" and lost[value].recallable


def test_what_the_agent_said_or_the_user_named_of_the_lost_facts_is_read_back_newest_first():
    from offpath.compaction.loss import lost_again

    report = loss_report(removed_part(), "Investigated it.", [])
    out = report.to_json()["lost"]
    flags = {f["value"]: (f["said"], f["asked"]) for f in out}
    assert flags["checkout-api-7f9c4-x450"] == (True, False)  # the agent's own words
    assert flags["OPS-4711"] == (False, True)  # the user's request
    assert flags["/etc/checkout/pool.yaml"] == (False, False)  # only the tool output
    older = [{"value": "ledger-7", "kind": "name", "message_id": "a0", "said": True}]
    older.append({"value": "OPS-4711", "kind": "ticket", "message_id": "h0", "asked": True})
    facts = {f.value: f for f in lost_again([older, out])}
    assert {"checkout-api-7f9c4-x450", "OPS-4711", "ledger-7"} <= set(facts)
    assert "/etc/checkout/pool.yaml" not in facts and "9f3e2a1c" not in facts
    assert facts["checkout-api-7f9c4-x450"].said and facts["OPS-4711"].asked
    # each value once, aged by the newest report that lists it
    assert facts["OPS-4711"].age == 1 and facts["ledger-7"].age == 2
    assert all(f.carried for f in facts.values())
