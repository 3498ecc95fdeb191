"""The cut rule, the skips and the no-progress rule (issue 2, items 3-4; the seed's edge cases)."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.graph.message import add_messages
from shared import check_compacted

from offpath.compaction.accounting import message_chars, total_chars
from offpath.compaction.pipeline import Compaction, compact
from offpath.compaction.planner import (
    CompactionPlan,
    Skip,
    SkipReason,
    min_gain_chars,
    plan_compaction,
    request_cap_chars,
    summary_budget_chars,
)
from offpath.compaction.summarizers.offline import OfflineSummarizer
from offpath.compaction.summary import build_summary_message, overhead_chars
from offpath.config import load_settings

S = load_settings(summarization_threshold_chars=10_000, summarization_keep_chars=3_000)


def turn(i, chars=1_000, calls=1):
    out = [HumanMessage(id=f"h{i}", content=f"question {i} " + "q" * 50)]
    ids = [f"c{i}-{k}" for k in range(calls)]
    if calls:
        out.append(
            AIMessage(
                id=f"a{i}",
                content="",
                tool_calls=[{"id": c, "name": "logs", "args": {}} for c in ids],
            )
        )
        out += [
            ToolMessage(id=f"t{i}-{k}", content="x" * chars, tool_call_id=c)
            for k, c in enumerate(ids)
        ]
    out.append(AIMessage(id=f"f{i}", content=f"answer {i}"))
    return out


def test_summarization_disabled_returns_at_once_without_reading_messages():
    class Untouchable(list):
        def __iter__(self):
            raise AssertionError("messages were read")

        def __len__(self):
            raise AssertionError("messages were read")

    for settings in (
        load_settings(summarization_enabled=False),
        load_settings(summarization_threshold_chars=0),
    ):
        result = plan_compaction(Untouchable(), settings)
        assert isinstance(result, Skip) and result.reason is SkipReason.DISABLED


def test_summarization_under_threshold_gives_no_plan():
    msgs = [m for i in range(3) for m in turn(i, chars=1_000)]
    result = plan_compaction(msgs, S)
    assert isinstance(result, Skip) and result.reason is SkipReason.UNDER_THRESHOLD


def test_summarization_cuts_at_turn_start_keeping_the_keep_window():
    msgs = [SystemMessage(id="sys", content="be brief")] + [
        m for i in range(8) for m in turn(i, 2_000)
    ]
    plan = plan_compaction(msgs, S)
    assert isinstance(plan, CompactionPlan) and plan.boundary == "turn"
    assert msgs[plan.cut].type == "human"
    assert sum(len(m.content) for m in msgs[plan.cut :]) >= S.summarization_keep_chars
    # the cut is the latest turn start that still keeps the window
    later_turns = [i for i in range(plan.cut + 1, len(msgs)) if msgs[i].type == "human"]
    assert all(sum(len(m.content) for m in msgs[i:]) < 3_000 for i in later_turns)
    assert plan.request is None


def test_summarization_fewer_than_two_turns_and_no_other_cut_is_skipped():
    # one request answered by one huge message: nothing can be cut
    msgs = [HumanMessage(id="h", content="why?"), AIMessage(id="a", content="z" * 20_000)]
    result = plan_compaction(msgs, S)
    assert isinstance(result, Skip)
    assert result.reason in (SkipReason.NO_CUT_POINT, SkipReason.TOO_FEW_MESSAGES)


@pytest.mark.parametrize("system", [True, False])
def test_a_thread_that_fits_its_keep_window_says_so_with_or_without_a_system_prompt(system):
    # the reason named a system prompt the thread did not have
    msgs = [HumanMessage(id="h", content="why?"), AIMessage(id="a", content="short answer")]
    if system:
        msgs.insert(0, SystemMessage(id="sys", content="s"))
    result = plan_compaction(msgs, S, force=True)
    assert isinstance(result, Skip) and result.reason is SkipReason.NO_CUT_POINT
    assert ("system prompt fits" in result.detail) is system, result.detail
    assert "fits the keep window" in result.detail


def test_summarization_single_turn_falls_back_to_tool_group_and_quotes_request():
    request = "The nightly job failed at 02:14 UTC.\nFind out why."
    msgs = [SystemMessage(id="sys", content="s"), HumanMessage(id="h", content=request)]
    for i in range(30):
        msgs += [
            AIMessage(
                id=f"a{i}",
                content=f"step {i}",
                tool_calls=[{"id": f"c{i}", "name": "q", "args": {}}],
            ),
            ToolMessage(id=f"t{i}", content="r" * 1_000, tool_call_id=f"c{i}"),
        ]
    outcome = compact(msgs, S, OfflineSummarizer())
    assert isinstance(outcome, Compaction) and outcome.plan.boundary == "tool_group"
    assert outcome.plan.request == request
    after = add_messages(msgs, outcome.patch)
    check_compacted(msgs, after)
    assert request in after[1].content  # word for word, line break included
    assert after[2].type == "ai"  # the kept tail starts at a complete tool-call group


def test_summarization_never_splits_a_parallel_batch():
    msgs = [m for i in range(4) for m in turn(i, 1_500)] + turn(9, chars=2_500, calls=4)
    plan = plan_compaction(msgs, S)
    assert isinstance(plan, CompactionPlan)
    kept_ids = {m.id for m in plan.kept}
    batch = {"a9", "t9-0", "t9-1", "t9-2", "t9-3"}
    assert batch <= kept_ids or not batch & kept_ids


def test_summarization_pending_call_and_everything_after_stay():
    msgs = [m for i in range(6) for m in turn(i, 2_000)]
    msgs += [
        HumanMessage(id="hp", content="restart it?"),
        AIMessage(id="ap", content="", tool_calls=[{"id": "cp", "name": "restart", "args": {}}]),
    ]
    # a result that arrives later for another pending call, with messages in between
    plan = plan_compaction(
        msgs, load_settings(summarization_threshold_chars=5_000, summarization_keep_chars=0)
    )
    assert isinstance(plan, CompactionPlan)
    assert [m.id for m in plan.kept][-2:] == ["hp", "ap"]
    assert plan.cut <= msgs.index(msgs[-1])


def test_summarization_result_after_an_interleaved_message_binds_its_call():
    msgs = [m for i in range(6) for m in turn(i, 2_000, calls=0)]
    msgs[3:3] = [
        AIMessage(id="ax", content="", tool_calls=[{"id": "cx", "name": "logs", "args": {}}]),
        HumanMessage(id="hx", content="here is a screenshot"),
        ToolMessage(id="tx", content="y" * 3_000, tool_call_id="cx"),
    ]
    for keep in range(0, 9_000, 500):
        settings = load_settings(summarization_threshold_chars=9_500, summarization_keep_chars=keep)
        plan = plan_compaction(msgs, settings)
        if isinstance(plan, CompactionPlan):
            removed = {m.id for m in plan.removed}
            assert ("ax" in removed) == ("tx" in removed)


def test_summarization_system_message_is_never_removed_or_moved():
    msgs = [SystemMessage(id="sys", content="s" * 100)] + [
        m for i in range(3) for m in turn(i, 2_000)
    ]
    msgs += [SystemMessage(id="sys2", content="mid-thread note")] + [
        m for i in range(3, 7) for m in turn(i, 2_000)
    ]
    outcome = compact(msgs, S, OfflineSummarizer())
    assert isinstance(outcome, Compaction)
    after = add_messages(msgs, outcome.patch)
    check_compacted(msgs, after)
    assert [m.id for m in after if m.type == "system"] == ["sys", "sys2"]


def test_summarization_no_progress_rule_stops_a_requeue_loop():
    """A fixed part over the threshold (a 12,000-char system prompt, which no compaction
    touches, at a 10,000-char threshold): the thread is held at that part, its newest turn and
    a summary (issue 30); later turns are compacted again only once they bring the thread's
    least gain, never one job per turn: 30 short turns make at most their chars over that gain
    compactions, and every skip says from which size a compaction is worth it."""
    settings = load_settings(summarization_threshold_chars=10_000, summarization_keep_chars=2_000)
    system = SystemMessage(id="sys", content="You are an SRE agent.\n" + "r" * 12_000)
    msgs = [system, *[m for i in range(4) for m in turn(i, 1_000)]]
    outcome = compact(msgs, settings, OfflineSummarizer())
    assert isinstance(outcome, Compaction), outcome
    thread = add_messages(msgs, outcome.patch)
    check_compacted(msgs, thread)
    fixed = total_chars([system])
    gain = min_gain_chars(settings, fixed)
    # held at the fixed part, the newest turn and a summary of its budget
    newest = total_chars(msgs[msgs.index(next(m for m in msgs if m.id == "h3")) :])
    assert total_chars(thread) - fixed <= newest + summary_budget_chars(settings, fixed)
    grown, compactions = 0, 0
    for i in range(30):
        new = [HumanMessage(id=f"x{i}", content="and?"), AIMessage(id=f"y{i}", content="ok")]
        grown += total_chars(new)
        thread = add_messages(thread, new)
        plan = plan_compaction(thread, settings)
        if isinstance(plan, CompactionPlan):
            compactions += 1
            done = compact(thread, settings, OfflineSummarizer())
            assert isinstance(done, Compaction)
            after = add_messages(thread, done.patch)
            check_compacted(thread, after)
            thread = after
            continue
        assert plan.reason in (SkipReason.NO_PROGRESS, SkipReason.TOO_FEW_MESSAGES), plan
        assert plan.worth_at > plan.total_chars
    assert compactions <= grown // gain + 1, (compactions, grown, gain)


def test_summarization_a_pasted_log_in_the_keep_window_is_kept_shortened():
    """Issue 18: "the keep window itself never holds more than its budget ... a cut is always
    possible". A pasted 12,000-char log (a human message) in the last turn held the keep
    window over its budget and every plan was a ``no_progress`` skip. Now the compaction cuts
    inside the window, keeps the log as the turn's request in place, shortened to
    :func:`request_cap_chars` with a pointer to its original, and lands the thread under its
    prepare floor."""
    settings = load_settings(summarization_threshold_chars=10_000, summarization_keep_chars=2_000)
    log = "what is wrong here?\n" + "\n".join(f"10:{k:02d} pod-x7 GC pause" for k in range(600))
    msgs = [m for i in range(4) for m in turn(i, 1_000)]
    msgs += [
        HumanMessage(id="hb", content=log),
        AIMessage(id="ab", content="", tool_calls=[{"id": "cb", "name": "dump", "args": {}}]),
        ToolMessage(id="tb", content="nothing", tool_call_id="cb"),
        AIMessage(id="fb", content="that is a lot"),
    ]
    outcome = compact(msgs, settings, OfflineSummarizer())
    assert isinstance(outcome, Compaction), outcome
    after = add_messages(msgs, outcome.patch)
    check_compacted(msgs, after)
    assert total_chars(after) <= settings.prepare_floor_chars
    (kept,) = [m for m in after if m.id == "hb"]
    assert len(kept.content) <= request_cap_chars(settings) < len(log)
    assert kept.content.startswith("what is wrong here?") and 'recall("hb")' in kept.content
    assert [m.id for m in after][-3:] == ["ab", "tb", "fb"]


def test_summarization_an_applied_compaction_lands_under_the_prepare_floor():
    """Issue 18, item 2 (the shape of gemini-cli#15225: a compaction that freed 1,761 chars
    left its thread over the threshold): every plan lands the thread under its prepare floor
    with its summary counted at its most, whatever the summarizer writes within its budget."""
    for threshold, keep in ((60_000, 20_000), (30_000, 10_000), (20_000, 6_000)):
        settings = load_settings(
            summarization_threshold_chars=threshold, summarization_keep_chars=keep
        )
        msgs = [m for i in range(40) for m in turn(i, threshold // 40)]
        plan = plan_compaction(msgs, settings)
        assert isinstance(plan, CompactionPlan), (threshold, plan)
        outcome = compact(msgs, settings, OfflineSummarizer())
        after = add_messages(msgs, outcome.patch)
        assert total_chars(after) <= plan.estimated_chars_after <= settings.prepare_floor_chars
        assert len(outcome.summary.content) <= summary_budget_chars(settings)


def test_summarization_a_huge_tool_result_in_the_keep_window_is_shortened_so_a_cut_fits():
    """Issue 18, item 1: the keep window walked back until it held *at least* the keep chars,
    so one 12,000-char result in the last turn was kept whole and the thread stayed over its
    threshold. Now the kept result is shortened (head, tail, facts, how to read the rest) and
    the compaction brings the thread under its prepare floor."""
    settings = load_settings(summarization_threshold_chars=10_000, summarization_keep_chars=2_000)
    msgs = [m for i in range(4) for m in turn(i, 1_000)]
    dump = "\n".join(
        f"2026-03-02T10:{k % 60:02d}:07Z pod-{k} Running restarts=0" for k in range(300)
    )
    msgs += [
        HumanMessage(id="hb", content="dump everything"),
        AIMessage(id="ab", content="", tool_calls=[{"id": "cb", "name": "dump", "args": {}}]),
        ToolMessage(id="tb", content=dump, tool_call_id="cb"),
        AIMessage(id="fb", content="that is a lot"),
    ]
    outcome = compact(msgs, settings, OfflineSummarizer())
    assert isinstance(outcome, Compaction) and outcome.plan.fits
    assert dict(outcome.plan.shorten).keys() == {"tb"}
    after = add_messages(msgs, outcome.patch)
    check_compacted(msgs, after)
    assert total_chars(after) <= settings.prepare_floor_chars
    result = next(m for m in after if m.id == "tb")
    assert dump.startswith(str(result.content).split("\n[offpath:")[0])
    assert 'recall("tb")' in str(result.content)


def test_summarization_min_gain_scales_with_settings():
    assert min_gain_chars(load_settings()) == 10_000
    assert (
        min_gain_chars(
            load_settings(summarization_threshold_chars=500, summarization_keep_chars=200)
        )
        == 75
    )


def test_summarization_seed_low_threshold_session_compacts():
    """The seed's 'trigger it in a real session' settings (500 / 200) do compact a session of
    the size its log line shows (session=1204 chars), and the summary is smaller than what it
    replaces."""
    settings = load_settings(summarization_threshold_chars=500, summarization_keep_chars=200)
    msgs = [m for i in range(4) for m in turn(i, 230)]
    assert 1_100 <= total_chars(msgs) <= 1_300
    outcome = compact(msgs, settings, OfflineSummarizer())
    assert isinstance(outcome, Compaction)
    assert len(outcome.summary.content) < outcome.plan.removed_chars
    assert total_chars(add_messages(msgs, outcome.patch)) < total_chars(msgs)


@pytest.mark.parametrize("missing", [None, ""])
def test_summarization_a_thread_with_a_message_without_id_is_skipped_not_planned(missing):
    """No compaction can remove a message without an id; the planner says so as a skip
    (every caller, the hook, the worker, the middleware and "compact now", handles a skip)
    where it raised ValueError, which made "compact now" answer 500 on a message with
    ``"id": ""`` (a helper's run) and the post-turn hook log a traceback at every turn."""
    msgs = [m for i in range(6) for m in turn(i, 2_000)]
    msgs[7] = msgs[7].model_copy(update={"id": missing})
    plan = plan_compaction(msgs, S)
    assert isinstance(plan, Skip) and plan.reason is SkipReason.MISSING_IDS
    assert "message 7" in plan.detail
    assert isinstance(plan_compaction(msgs, S, force=True), Skip)


def test_summarization_a_call_abandoned_by_a_later_turn_does_not_block_compaction():
    """Input already broken (a call never answered, then more turns) still compacts, and
    compacting adds no orphan of its own."""
    msgs = turn(0, 1_000)
    msgs.append(
        AIMessage(id="lost", content="", tool_calls=[{"id": "c-lost", "name": "logs", "args": {}}])
    )
    msgs += [m for i in range(1, 8) for m in turn(i, 2_000)]
    outcome = compact(msgs, S, OfflineSummarizer())
    assert isinstance(outcome, Compaction)
    after = add_messages(msgs, outcome.patch)
    check_compacted(msgs, after)
    # issue 18, item 6: a call without its result is never summarized away (its result may
    # still come, turns later: a long-running call); the compaction removes what is around it
    assert "lost" not in {m.id for m in outcome.plan.removed}
    assert [m.id for m in after].index("lost") == 1  # right after the summary, in place


def test_summarization_reused_call_ids_pair_each_call_with_its_own_result():
    # every turn's first call is "fetch_logs:0" (per-response numbering, as Ollama does)
    msgs = []
    for i in range(8):
        msgs += [
            HumanMessage(id=f"h{i}", content=f"question {i}"),
            AIMessage(
                id=f"a{i}", content="", tool_calls=[{"id": "fetch_logs:0", "name": "f", "args": {}}]
            ),
            ToolMessage(id=f"t{i}", content="x" * 2_000, tool_call_id="fetch_logs:0"),
            AIMessage(id=f"f{i}", content=f"answer {i}"),
        ]
    plan = plan_compaction(msgs, S)
    assert isinstance(plan, CompactionPlan) and plan.boundary == "turn"
    outcome = compact(msgs, S, OfflineSummarizer())
    check_compacted(msgs, add_messages(msgs, outcome.patch))


def test_summarization_parallel_calls_with_per_response_ids_stay_together():
    msgs = []
    for i in range(6):
        calls = [{"id": f"call_{k}", "name": "f", "args": {}} for k in range(3)]
        msgs += [
            HumanMessage(id=f"h{i}", content=f"q{i}"),
            AIMessage(id=f"a{i}", content="", tool_calls=calls),
            *[
                ToolMessage(id=f"t{i}-{k}", content="y" * 1_000, tool_call_id=f"call_{k}")
                for k in (2, 0, 1)
            ],
            AIMessage(id=f"f{i}", content="done"),
        ]
    outcome = compact(msgs, S, OfflineSummarizer())
    assert isinstance(outcome, Compaction)
    check_compacted(msgs, add_messages(msgs, outcome.patch))


def test_summarization_orphan_results_are_removed_by_the_next_compaction():
    msgs = [m for i in range(8) for m in turn(i, 2_000)]
    orphan_early = ToolMessage(id="o1", content="left by a bad trim", tool_call_id="gone-1")
    orphan_late = ToolMessage(id="o2", content="answered twice", tool_call_id="c7-0")
    msgs = [msgs[0], orphan_early, *msgs[1:], orphan_late]
    outcome = compact(msgs, S, OfflineSummarizer())
    assert isinstance(outcome, Compaction)
    after = add_messages(msgs, outcome.patch)
    check_compacted(msgs, after)
    assert {"o1", "o2"} <= set(outcome.summary.additional_kwargs["summary"]["replaced_ids"])
    assert not {"o1", "o2"} & {m.id for m in after}


def test_summarization_a_user_message_opening_like_a_summary_is_a_request():
    from offpath.compaction.summary import SUMMARY_PREFIX, is_summary

    pasted = HumanMessage(id="p", content=f"{SUMMARY_PREFIX}\n\nmy notes; now: why is auth down?")
    assert not is_summary(pasted)
    msgs = [m for i in range(8) for m in turn(i, 2_000)] + [pasted]
    outcome = compact(msgs, S, OfflineSummarizer())
    after = add_messages(msgs, outcome.patch)
    assert after[-1] == pasted


def test_a_job_that_lands_over_the_threshold_names_the_next_job_and_only_then():
    """worker.jobs.follow_up: a thread just compacted that is still over its threshold, with
    a cut to make, gets its next job from the job itself (turns that came while it ran
    queued nothing); under the threshold, or with nothing to remove, none."""
    from offpath.worker.jobs import follow_up

    over = [m for i in range(12) for m in turn(i)]
    assert total_chars(over) > S.summarization_threshold_chars
    assert follow_up(over, S) == total_chars(over)
    assert follow_up(over[:6], S) is None  # under the threshold
    one = [HumanMessage(id="h", content="paste " + "x" * 12_000)]  # over, but no cut
    assert total_chars(one) > S.summarization_threshold_chars
    assert follow_up(one, S) is None


def _steps(n, chars):
    """One request, then ``n`` model steps of one call and a ``chars`` result each."""
    out = [HumanMessage(id="h0", content="investigate the outage")]
    for i in range(n):
        out.append(
            AIMessage(
                id=f"a{i}", content="", tool_calls=[{"id": f"c{i}", "name": "logs", "args": {}}]
            )
        )
        out.append(ToolMessage(id=f"t{i}", content="x" * chars, tool_call_id=f"c{i}"))
    return out


def _kept_chars(plan):
    return sum(len(m.content) for m in plan.kept)


def test_an_early_plan_keeps_what_the_keep_window_needs_once_the_thread_crossed():
    # planned under the threshold, a compaction is applied only once the thread is over it
    # (the forced one excepted): by then at least (threshold - size at the plan) more chars
    # follow its kept part, so the keep window at the apply needs only the rest of it now.
    # Kept whole, a fast run's early plans removed 9k of 23k and the thread was over its
    # threshold again at the apply (benchmark 17, django at 30,000 / 10,000).
    settings = load_settings(summarization_threshold_chars=30_000, summarization_keep_chars=10_000)
    messages = _steps(13, 1_900)  # ~24.7k chars: over the 0.8 prepare floor, under the threshold
    total = total_chars(messages)
    assert settings.prepare_floor_chars < total < 30_000
    plan = plan_compaction(messages, settings, early=True)
    assert isinstance(plan, CompactionPlan)
    headroom = 30_000 - total
    kept = _kept_chars(plan)
    assert kept < 10_000 - 1_900  # a step or more deeper than a plan made over the threshold
    # once over the threshold, what follows the kept part completes the keep window
    assert kept + headroom >= 10_000
    # an operator's compact-now is applied where it is planned: the whole keep window stays
    forced = plan_compaction(messages, settings, force=True)
    assert isinstance(forced, CompactionPlan)
    assert _kept_chars(forced) >= 10_000


def test_a_plan_over_the_threshold_keeps_the_whole_keep_window():
    settings = load_settings(summarization_threshold_chars=30_000, summarization_keep_chars=10_000)
    messages = _steps(17, 1_900)
    assert total_chars(messages) > 30_000
    for early in (False, True):
        plan = plan_compaction(messages, settings, early=early)
        assert isinstance(plan, CompactionPlan)
        assert _kept_chars(plan) >= 10_000


def test_chars_a_call_sends_besides_the_thread_count_against_the_threshold():
    """A system prompt given to create_agent is in no checkpoint; the job carries its size
    (``outside_chars``) and the planner counts it as a system message of the thread: over
    the threshold with it, a plan; the keep window is still the thread's own."""
    settings = load_settings(summarization_threshold_chars=30_000, summarization_keep_chars=10_000)
    messages = _steps(12, 1_900)  # ~22.8k: under the threshold and its prepare floor alone
    assert total_chars(messages) < settings.prepare_floor_chars
    skip = plan_compaction(messages, settings)
    assert isinstance(skip, Skip) and skip.reason is SkipReason.UNDER_THRESHOLD
    plan = plan_compaction(messages, settings, outside_chars=8_000)
    assert isinstance(plan, CompactionPlan)
    assert plan.total_chars == total_chars(messages) + 8_000
    assert _kept_chars(plan) >= 10_000  # over the threshold: the whole keep window
    # what the call will send after it lands under the prepare floor, the prompt counted
    assert plan.estimated_chars_after <= settings.prepare_floor_chars


def test_a_small_threshold_still_gives_the_summary_room_for_its_facts():
    """15% of a 4,000-char threshold is 600 chars, which the template, the agent's place and
    the recall line fill: tau-bench's ground-truth ids stayed in view after 54% of
    compactions (benchmark 14). Where the prepare floor leaves room beside the keep window,
    the budget is up to 1,400 chars; the seed's 500 / 200 try-out keeps its 300."""

    def budget(threshold, keep):
        return summary_budget_chars(
            load_settings(summarization_threshold_chars=threshold, summarization_keep_chars=keep)
        )

    assert budget(4_000, 1_500) == 1_388  # floor 3,200 - keep 1,500 - half the 625 gain
    assert budget(8_000, 3_000) == 1_400  # room 2,775: the 1,400 floor, over 15% (1,200)
    assert budget(60_000, 20_000) == 9_000  # 15%
    assert budget(500, 200) == 300  # the seed's try-out: no room beside its keep window
    assert budget(3_000, 1_500) == 713  # floor 2,400 - keep 1,500 - 187: what room there is


def test_a_finished_turn_across_the_keep_windows_edge_goes_whole():
    """DESIGN.md invariant 17 with the seed's keep window: the window's edge falls inside a
    long finished turn that began right after an earlier summary. Keeping that turn whole
    leaves nothing worth removing (the summary alone), and cutting inside it would keep its
    answer without its request: it goes whole, and the later turns are kept (less than the
    window, every turn whole)."""
    from offpath.compaction.summary import SUMMARY_PREFIX

    summary = HumanMessage(
        id="s0",
        content=f"{SUMMARY_PREFIX}\n\n**Investigating:** x\n**Key findings:**\n- y",
        additional_kwargs={"lc_source": "summarization"},
    )
    long_turn = turn(0, chars=1_500, calls=1)
    for k in range(6):
        long_turn[-1:-1] = [
            AIMessage(
                id=f"more-a{k}",
                content="",
                tool_calls=[{"id": f"m{k}", "name": "logs", "args": {}}],
            ),
            ToolMessage(id=f"more-t{k}", content="y" * 1_400, tool_call_id=f"m{k}"),
        ]
    msgs = [summary, *long_turn, *turn(1, chars=600), *turn(2, chars=600)]
    for force in (False, True):
        plan = plan_compaction(msgs, S, force=force)
        assert isinstance(plan, CompactionPlan), plan
        assert plan.kept[0].id == "h1" and {m.id for m in long_turn} <= {m.id for m in plan.removed}
        outcome = compact(msgs, S, OfflineSummarizer()) if not force else None
        if outcome is not None:
            check_compacted(msgs, add_messages(msgs, outcome.patch))


def test_an_earlier_summary_folded_in_is_room_the_new_summary_keeps():
    """A compaction that removes an earlier summary replaces it: the new summary carries what
    it held (its pinned facts), so its size bound counts it whole and halves only the rest.
    Halving the earlier one too left this 1,352-char summary's successor 911 chars at 4,000 /
    1,500 and dropped the ids it listed (benchmark 14: 15 of one run's ground-truth facts out
    of view at once). The cut stays worth its least gain and lands under the floor, deeper
    if it must."""
    settings = load_settings(summarization_threshold_chars=4_000, summarization_keep_chars=1_500)
    ids = ", ".join(f"K{k:03d}X9" for k in range(150))
    text = (
        "**Investigating:** the bookings.\n**Key findings:**\n**Ruled out:**\n"
        f"**Current state:** checking.\n\n**Pinned facts** (`recall` finds each):\n- ids: {ids}"
    )
    earlier = build_summary_message(
        message_id="s0",
        summary_text=text[:1_300],
        replaced_ids=["x"],
        replaced_chars=9_000,
        summarizer="generic",
        compactions=1,
        request=None,
    )
    thread = [earlier, *turn(1, 400), *turn(2, 1_200), *turn(3, 1_200)]
    total = total_chars(thread)
    plan = plan_compaction(thread, settings)
    assert isinstance(plan, CompactionPlan) and earlier in plan.removed
    size = plan.summary_chars + overhead_chars(plan.request)
    assert size >= min(summary_budget_chars(settings), message_chars(earlier))
    assert total - plan.estimated_chars_after >= min_gain_chars(settings)
    assert plan.estimated_chars_after <= settings.prepare_floor_chars
