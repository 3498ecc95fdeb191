"""Issue 19 in the compaction core: the agent's place in every summary (DESIGN.md invariant
15), the fact guard's second version, the check before the swap (invariant 16), the LLM
reading everything it removes, and failed tool calls never read as done.

The expected values are written into the inputs below by hand."""

from __future__ import annotations

import random
import re

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph.message import add_messages

from offpath.compaction.facts.extraction import extract
from offpath.compaction.facts.patterns import find
from offpath.compaction.facts.pinning import pin
from offpath.compaction.facts.sections import PINNED_HEADING, SWAP_HEADING
from offpath.compaction.frontier import is_follow_up, read_frontier
from offpath.compaction.patch import Stale, fit
from offpath.compaction.pipeline import Compaction, compact
from offpath.compaction.planner import CompactionPlan, landing_chars, plan_compaction
from offpath.compaction.prompt import build_prompt, render_message
from offpath.compaction.summarizers.base import SummaryResult
from offpath.compaction.summarizers.guarded import GuardedSummarizer
from offpath.compaction.summarizers.offline import OfflineSummarizer
from offpath.config import load_settings
from offpath.llm import MAX_CALLS, LLMSummarizer

S = load_settings(summarization_threshold_chars=20_000, summarization_keep_chars=6_000)


class Generic:
    """An LLM-shaped summarizer that names nothing specific (and starts from an old task)."""

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


def logs(i: int, chars: int = 1_500) -> str:
    return "\n".join(f"10:{k % 60:02d}:07Z INFO step {i} line {k} ok" for k in range(chars // 30))


def tool_step(prefix: str, i: int, name: str = "bash", status: str = "success") -> list:
    cid = f"{prefix}-c{i}"
    return [
        AIMessage(
            id=f"{prefix}-a{i}",
            content="",
            tool_calls=[{"id": cid, "name": name, "args": {"n": i}}],
        ),
        ToolMessage(id=f"{prefix}-t{i}", content=logs(i), tool_call_id=cid, status=status),
    ]


def summary_of(messages, kind):
    outcome = compact(messages, S, SUMMARIZERS[kind]())
    assert isinstance(outcome, Compaction), outcome
    return str(outcome.summary.content), outcome


def sections(text: str) -> tuple[str, str]:
    """(the Investigating part, the Current state part, Done included) of a summary."""
    investigating = text.split("**Key findings:**")[0]
    state = text.split("**Current state:**", 1)[1].split(PINNED_HEADING)[0]
    return investigating, state


@pytest.mark.parametrize("kind", SUMMARIZERS)
@pytest.mark.parametrize("seed", range(5))
def test_a_finished_task_is_done_and_the_one_after_it_is_current(kind, seed):
    r = random.Random(seed)
    a = f"Rotate the TLS certificate of gateway-{r.randint(10, 99)} before it expires."
    b = f"Now find why the payments-{r.randint(10, 99)} queue keeps growing."
    msgs = [SystemMessage(id="sys", content="sys"), HumanMessage(id="ha", content=a)]
    for i in range(r.randint(3, 6)):
        msgs += tool_step("a", i)
    msgs.append(AIMessage(id="fa", content="The certificate is rotated; it now expires in 2027."))
    msgs += [HumanMessage(id="hb", content=b)]
    for i in range(r.randint(8, 12)):
        msgs += tool_step("b", i)
    text, _ = summary_of(msgs, kind)
    investigating, state = sections(text)
    assert f"**Investigating:** {b}\n" in investigating  # B is current, word for word
    assert f"**Original request** (done): {a}" in investigating  # A, the task: done
    assert a not in state.split("**Done:**")[0]  # never listed as open
    # open, and not repeated: the Investigating line names it (issue 32: no line repeats
    # another)
    assert "- Open: the latest request is under way" in state and b[:40] not in state


@pytest.mark.parametrize("kind", SUMMARIZERS)
def test_a_plan_with_three_steps_done_names_the_fourth_as_under_way(kind):
    plan = (
        "Plan:\n1. Reproduce the failing import\n2. Find the bad row\n"
        "3. Patch the parser\n4. Rerun the nightly job\n5. Close the ticket"
    )
    msgs = [
        SystemMessage(id="sys", content="sys"),
        HumanMessage(id="h", content="The nightly import failed; fix it."),
        AIMessage(id="plan", content=plan),
    ]
    for n, word in (
        (1, "Step 1 done: reproduced."),
        (2, "Step 2 is done."),
        (3, "Step 3 completed."),
    ):
        msgs += tool_step("s", n)
        msgs.append(AIMessage(id=f"ok{n}", content=word))
    msgs.append(AIMessage(id="go4", content="Now step 4: rerunning the nightly job."))
    for i in range(10, 22):
        msgs += tool_step("s", i)
    text, _ = summary_of(msgs, kind)
    _, state = sections(text)
    open_part = state.split("- Open:")[1].split("\n")[0]
    assert open_part.strip().startswith("step 4 (under way): Rerun the nightly job")
    assert not re.search(r"step [123]\b", open_part)  # nothing finished listed as pending
    done = state.split("**Done:**")[1]
    assert "step 1 (done)" in done and "step 3 (done)" in done


@pytest.mark.parametrize("kind", SUMMARIZERS)
def test_a_numbered_list_of_names_is_no_plan(kind):
    # "1. `pod-a`:" heads the details of one item: it says nothing to do (a plan's step does),
    # and listing it as an open step costs the summary's room and misleads the agent
    report = (
        "Memory usage details for catalogue pods:\n\n1. `catalogue-f7687cb4-zsngc`:\n"
        "   - Memory Requests: 100 Mi\n\n2. `catalogue-db-c948fd796-w4vzl`:\n"
        "   - No explicit memory requests or limits configured."
    )
    msgs = [
        SystemMessage(id="sys", content="sys"),
        HumanMessage(id="h", content="Get the memory usage of the catalogue pods."),
        AIMessage(id="report", content=report),
        HumanMessage(id="h2", content="Now check the orders pods."),
    ]
    for i in range(12):
        msgs += tool_step("s", i)
    text, _ = summary_of(msgs, kind)
    _, state = sections(text)
    assert "step 1" not in state and "step 2" not in state


@pytest.mark.parametrize("kind", SUMMARIZERS)
def test_an_instruction_revised_later_is_the_one_in_force(kind):
    msgs = [
        SystemMessage(id="sys", content="sys"),
        HumanMessage(id="h1", content="Deploy the fix to the staging cluster."),
    ]
    for i in range(4):
        msgs += tool_step("x", i)
    msgs.append(HumanMessage(id="h2", content="Actually, deploy it to prod-eu instead of staging."))
    for i in range(4, 16):
        msgs += tool_step("x", i)
    text, _ = summary_of(msgs, kind)
    investigating, state = sections(text)
    assert "**Original request** (superseded: revised by a later request):" in investigating
    assert "**Investigating:** Actually, deploy it to prod-eu instead of staging." in investigating
    assert "Instructions in force: Actually, deploy it to prod-eu" in state


def test_continue_is_no_request_of_its_own():
    for text in ("continue", "Proceed.", "ok, go on", "yes please", "  carry on!  "):
        assert is_follow_up(text), text
    assert not is_follow_up("continue with the database migration")
    msgs = [
        HumanMessage(id="h1", content="Check the pods in the default namespace."),
        *tool_step("p", 1),
        AIMessage(id="f1", content="Two pods are failing."),
        HumanMessage(id="h2", content="continue"),
        *tool_step("p", 2),
    ]
    frontier = read_frontier(msgs)
    assert frontier.task == "Check the pods in the default namespace." and frontier.latest is None


def test_a_failed_call_is_open_and_marked_failed_in_the_prompt_and_the_summary():
    """Issue 19, item 4 (the shape of prime-agent#2424): a rollback whose result came back
    with status error must not be summarized as done."""
    msgs = [
        SystemMessage(id="sys", content="sys"),
        HumanMessage(id="h", content="Roll back checkout-api to v2.4.1."),
        AIMessage(
            id="a1",
            content="",
            tool_calls=[{"id": "rb", "name": "rollback_release", "args": {"to": "v2.4.1"}}],
        ),
        ToolMessage(
            id="t1",
            content="ERROR: rollback of checkout-api failed: image v2.4.1 not found",
            tool_call_id="rb",
            status="error",
            name="rollback_release",
        ),
    ]
    for i in range(16):
        msgs += tool_step("f", i)
    assert "FAILED" in render_message(msgs[3], "0" * 16).splitlines()[0]
    for kind in SUMMARIZERS:
        text, _ = summary_of(msgs, kind)
        _, state = sections(text)
        assert "FAILED, not done: rollback_release" in state


def test_the_second_version_finds_the_blind_spots_of_the_first():
    text = (
        "    Last State:     Terminated\n      Reason:       OOMKilled\n"
        "      Exit Code:    137\n    Restart Count:  6\n      cpu:     850m\n"
        "DEPLOY_ENV=prod DB_TIMEOUT=5s image checkout-api:v2.4.2 (lib 2.3.1)\n"
        "the bug is in validateEmailPattern() called by signup\n"
        "order #W2378156 item 1151293680 paid with credit_card_9513926 by chen_johnson_4204"
    )
    values = {v for v, _, _ in find(text)}
    for fact in (
        "Exit Code: 137",  # any letter case, runs of spaces collapsed
        "Restart Count: 6",
        "cpu: 850m",  # a setting with its value (millicores)
        "DEPLOY_ENV",
        "DB_TIMEOUT=5s",
        "v2.4.2",
        "2.3.1",
        "validateEmailPattern()",
        "#W2378156",
        "1151293680",
        "credit_card_9513926",
        "chen_johnson_4204",
    ):
        assert fact in values, fact


def test_an_identifier_counts_by_its_use_and_noise_is_not_pinned():
    """A ten-digit item id and a zip code are facts because the agent passed them to a tool
    and the user gave them; the same kind of number seen once in a log is not. Healthy rows
    of a pod table, a directory listing and /dev/null are never pinned for themselves."""
    removed = [
        HumanMessage(
            id="h", content="Exchange item 1151293680 of order #W2378156; my zip is 94110."
        ),
        AIMessage(
            id="a",
            content="",
            tool_calls=[
                {"id": "c", "name": "get_order", "args": {"order_id": "#W2378156", "zip": "94110"}}
            ],
        ),
        ToolMessage(
            id="t",
            content="NAME  READY  STATUS  RESTARTS\nweb-7f9c4-x1  1/1  Running  0\n"
            "web-7f9c4-x2  1/1  Running  0\n-rw-r--r-- 1 root root 2048 app.log\n"
            "/srv/app/config/settings.yaml\nwrote 0 bytes to /dev/null\n"
            'request 5550123 served\n{"item_id": "1151293680", "status": "delivered"}',
            tool_call_id="c",
        ),
    ]
    facts = {f.value: f for f in extract(removed)}
    assert facts["1151293680"].score > 0 and facts["94110"].score > 0
    assert facts["5550123"].score == 0  # a number nobody used
    assert facts["web-7f9c4-x1"].score == 0  # on a healthy row only
    assert "/dev/null" not in facts
    text, _ = pin("s", removed, 2_000)
    assert "1151293680" in text and "#W2378156" in text and "94110" in text
    assert "web-7f9c4-x2" not in text and "settings.yaml" not in text


def test_near_identical_log_lines_are_quoted_once():
    lines = "\n".join(
        f"2026-03-02T10:{k:02d}:07Z ERROR checkout-api pool exhausted: 64/64 in use"
        for k in range(8)
    )
    removed = [ToolMessage(id="t", content=lines, tool_call_id="c")]
    text, pinned = pin("s", removed, 2_000)
    # the other seven lines' times, only the log holds, as one range
    assert text.count("pool exhausted") == 1 and "10:01:07Z-10:07:07Z (7)" in text


def test_no_telephone_game_over_twenty_compactions():
    """A fact pinned at one compaction is still in the summary or pinned 20 compactions later,
    in at least 95% of cases, with an LLM-shaped summarizer that drops a tenth of the facts
    it is given at each pass (issue 19)."""
    rng = random.Random(7)

    class Forgetful:
        name = "forgetful"

        def summarize(self, plan, prompt):
            words = re.findall(r"`([^`]+)`", prompt.user)
            kept = [w for w in dict.fromkeys(words) if rng.random() > 0.1][:40]
            return SummaryResult(
                text="**Investigating:** the incident\n**Key findings:**\n"
                + "".join(f"- `{w}`\n" for w in kept)
                + "**Ruled out:** nothing ruled out yet\n**Current state:** going on",
                model="forgetful",
            )

    settings = load_settings(summarization_threshold_chars=30_000, summarization_keep_chars=8_000)
    summarizer = GuardedSummarizer(Forgetful(), settings.summary_pinned_max_chars)
    thread: list = [
        SystemMessage(id="sys", content="sys"),
        HumanMessage(id="h0", content="Why are checkouts failing?"),
    ]
    first_pinned: set[str] = set()
    for round_ in range(21):
        for k in range(6):
            i = round_ * 6 + k
            cid = f"c{i}"
            thread = add_messages(
                thread,
                [
                    AIMessage(
                        id=f"a{i}",
                        content=f"Pod web-{i:03d}x is failing with ERR-{1000 + i}.",
                        tool_calls=[{"id": cid, "name": "logs", "args": {"pod": f"web-{i:03d}x"}}],
                    ),
                    ToolMessage(id=f"t{i}", content=logs(i, 2_500), tool_call_id=cid),
                ],
            )
        outcome = compact(thread, settings, summarizer)
        if not isinstance(outcome, Compaction):
            continue
        thread = add_messages(thread, outcome.patch)
        text = str(outcome.summary.content)
        if not first_pinned and PINNED_HEADING in text:
            first_pinned = set(re.findall(r"ERR-\d+", text.split(PINNED_HEADING)[1]))
    assert len(first_pinned) >= 5
    visible = "\n".join(str(m.content) for m in thread)
    kept = [f for f in first_pinned if f in visible]
    assert len(kept) >= 0.95 * len(first_pinned), sorted(set(first_pinned) - set(kept))


def test_the_check_before_the_swap_pins_what_a_later_message_names():
    """Issue 19 (invariant 16): while the summary was written, the agent named ERR-7731, which
    only a removed message held and the summary did not keep: the swap pins it."""
    settings = load_settings(summarization_threshold_chars=20_000, summarization_keep_chars=6_000)
    msgs = [SystemMessage(id="sys", content="sys"), HumanMessage(id="h", content="Find the fault.")]
    for i in range(14):
        msgs += tool_step("w", i)
    msgs[5] = msgs[5].model_copy(
        update={"content": str(msgs[5].content) + "\nERROR code ERR-7731 on db-node-3"}
    )
    plan = plan_compaction(msgs, settings, early=True)
    assert isinstance(plan, CompactionPlan) and msgs[5] in plan.removed

    class Vague:
        name = "vague"

        def summarize(self, plan, prompt):
            return SummaryResult(
                text="**Investigating:** x\n**Key findings:**\n- y\n**Ruled out:** z\n**Current state:** w",
                model="vague",
            )

    outcome = compact(msgs, settings, GuardedSummarizer(Vague(), 0))  # no pinned facts at all
    assert "ERR-7731" not in str(outcome.summary.content)
    later = [AIMessage(id="later", content="ERR-7731 on db-node-3 explains the timeouts.")]
    fitted = fit(
        outcome.prepared, [*msgs, *later], target=landing_chars(settings), settings=settings
    )
    assert not isinstance(fitted, Stale), fitted
    summary = str(fitted.summary.content)
    assert SWAP_HEADING in summary and "ERR-7731" in summary.split(SWAP_HEADING)[1]
    assert fitted.record["checked_at_swap"] >= 1


class Recorder(BaseChatModel):
    """A chat model that records every prompt and answers a summary in the template."""

    prompts: list[str] = []

    @property
    def _llm_type(self) -> str:
        return "recorder"

    def _generate(self, messages, stop=None, run_manager=None, **kw):
        self.prompts.append(str(messages[-1].content))
        text = (
            "**Investigating:** the incident\n**Key findings:**\n- a finding\n"
            "**Ruled out:** nothing ruled out yet\n**Current state:** going on"
        )
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])


def test_the_llm_reads_everything_it_removes_in_a_bounded_number_of_calls():
    """Issue 19: a removal larger than the prompt cap is summarized chunk by chunk, each
    chunk's summary folded into the next prompt, in at most MAX_CALLS calls; every removed
    message reaches a prompt (its own text, not only its header)."""
    settings = load_settings(
        summarization_threshold_chars=200_000,
        summarization_keep_chars=20_000,
        summarization_max_prompt_chars=40_000,
    )
    msgs: list = [
        SystemMessage(id="sys", content="sys"),
        HumanMessage(id="h", content="Audit every service."),
    ]
    for i in range(90):
        cid = f"c{i}"
        msgs += [
            AIMessage(
                id=f"a{i}", content="", tool_calls=[{"id": cid, "name": "logs", "args": {"i": i}}]
            ),
            ToolMessage(id=f"t{i}", content=f"MARK-{i:03d} " + "z " * 1_200, tool_call_id=cid),
        ]
    plan = plan_compaction(msgs, settings)
    assert isinstance(plan, CompactionPlan) and plan.removed_chars > 4 * 40_000
    model = Recorder()
    model.prompts = []
    summarizer = LLMSummarizer(model, "recorder", settings.summarization_max_prompt_chars)
    summarizer.summarize(plan, build_prompt(plan, settings.summarization_max_prompt_chars))
    assert 1 < len(model.prompts) <= MAX_CALLS
    assert all(len(p) <= 40_000 for p in model.prompts)
    read = "\n".join(model.prompts)
    removed_marks = {
        f"MARK-{i:03d}" for i in range(90) if any(m.id == f"t{i}" for m in plan.removed)
    }
    assert removed_marks and all(mark in read for mark in removed_marks)
    assert "earlier summary" in model.prompts[1]  # the chunk before it, folded in


def test_a_clipped_request_keeps_its_pointer_through_the_next_summary():
    # a long request the first summary clipped is cited as (whole: recall("<id>")); read
    # back from that summary's text, the next one cites the same message (issue 19: it read
    # "for the......" with no way back), and the same request is never shown twice
    from offpath.compaction.frontier import Frontier, into_summary
    from offpath.compaction.summary import cite

    uid = "f1db178e-6948-4b29-a54c-a34f4869aa6e"
    text = (
        "**Investigating:** The departure is on May 27 for the... "
        f'(whole: recall("{cite(uid)}"))\n**Key findings:**\n- x\n**Ruled out:** none\n'
        "**Current state:** searching flights"
    )
    carried = Frontier.from_text(text)
    assert carried.task == "The departure is on May 27 for the..."
    assert carried.task_id == "f1db178e"
    template = "**Investigating:** y\n**Key findings:**\n**Ruled out:** none\n**Current state:** z"
    again = into_summary(template, carried, 600)
    assert 'The departure is on May 27 for the... (whole: recall("f1db178e"))' in again
    same = Frontier(task="check the pods", latest="check  the pods")
    shown = into_summary(template, same, 600)
    assert shown.count("check the pods") == 1 and "Original request" not in shown


def test_a_small_budget_is_spent_on_values_not_on_blobs():
    # issue 19, tau-bench: a fact on a 1,000-char JSON line was "quoted" as `..."15:00:00",...`;
    # such a line is listed by value, and a time of day ranks below the ids beside it
    row = ", ".join(
        f'{{"flight_number": "HAT{k:03d}", "departure": "{10 + k % 9}:00:00"}}' for k in range(30)
    )
    removed = [ToolMessage(id="t1", content=f"[{row}]", tool_call_id="c")]
    text, pinned = pin("s", removed, 400)
    section = text.split(PINNED_HEADING, 1)[1]
    assert "`..." not in section and "- ids: HAT000, HAT001, HAT002" in section
    facts = {f.value: f for f in extract(removed)}
    assert facts["10:00:00"].score < facts["HAT000"].score


def test_the_request_in_progress_keeps_its_object_at_a_small_budget():
    # benchmark 15's switch probe at a 10,000-char threshold (a 300-char frontier budget):
    # the latest request was clipped after 60 chars ("...Now: Restore the DNS..."), losing
    # what the agent is doing; it now gets the larger share, the first request the smaller
    from offpath.compaction.frontier import Frontier, into_summary

    template = "**Investigating:** y\n**Key findings:**\n**Ruled out:** none\n**Current state:** z"
    latest = (
        "Good, that one is finished. Now: Restore the DNS record of status-page-6; it points "
        "at the old balancer."
    )
    task = "Rotate the TLS certificate of ingress-gw-5 today, please; it expires in two days."
    frontier = Frontier(task=task, task_id="t1", task_status="done", latest=latest, latest_id="h9")
    text = into_summary(template, frontier, 300)
    investigating = text.split("\n")[0]
    assert "the DNS record of status-page-6" in investigating, investigating
    original = next(line for line in text.split("\n") if line.startswith("**Original request"))
    assert "(done)" in original and len(original) < len(investigating) + 40


def test_the_original_request_is_read_back_from_the_summary_that_wrote_it():
    # issue 19: Frontier.from_text matched an old form of the line, so from the second
    # compaction on the task (and the ids it named) was replaced by the latest request
    from offpath.compaction.frontier import Frontier, into_summary

    template = "**Investigating:** y\n**Key findings:**\n**Ruled out:** none\n**Current state:** z"
    task = "I need to cancel my upcoming flights. The reservation IDs are XEHM4B and 59XX6W."
    for status, stored in (("done", "done"), ("revised", "revised"), (None, None)):
        frontier = Frontier(
            task=task, task_id="h1", task_status=status, latest="Yes, go ahead.", latest_id="h2"
        )
        back = Frontier.from_text(into_summary(template, frontier, 600))
        assert back is not None
        assert (back.task, back.task_status, back.latest) == (task, stored, "Yes, go ahead.")


def test_a_request_in_view_is_pointed_at_not_repeated():
    # issue 32: the Investigating line repeated the start of a request the summary quotes at
    # its end, or that the kept messages hold (a mini-swe task: ~400 of a 4,500-char budget);
    # it points at it, reads back whole from the quote, and a pointer longer than the
    # request it stands for is not taken
    from offpath.compaction.frontier import KEPT_AFTER, QUOTED_BELOW, Frontier, into_summary

    template = "**Investigating:** y\n**Key findings:**\n**Ruled out:** none\n**Current state:** z"
    task = "Fix the migration bug. " + "The rename of a primary key breaks to_field. " * 8
    latest = "Now the autodetector: " + "it misses the renamed field in the state. " * 8
    quoted = into_summary(template, Frontier(task=task, task_id="h1"), 600, quoted=task)
    line = quoted.split("\n")[0]
    assert line == f"**Investigating:** the request of message h1, {QUOTED_BELOW}"
    back = Frontier.from_text(quoted, request=task)
    assert back is not None and (back.task, back.task_id) == (" ".join(task.split()), "h1")
    both = Frontier(task=task, task_id="h1", latest=latest, latest_id="h7")
    kept = into_summary(template, both, 600, kept={"h7"})
    assert kept.split("\n")[0] == f"**Investigating:** the request of message h7, {KEPT_AFTER}"
    assert "Fix the migration bug." in kept  # the task, not in view, is quoted
    back = Frontier.from_text(kept)
    assert back is not None and back.task.startswith("Fix the migration") and back.latest_id == "h7"
    short = into_summary(template, Frontier(task="Why?", task_id="h1"), 600, quoted="Why?")
    assert short.split("\n")[0] == "**Investigating:** Why?"
    # the task is never pointed at by a kept copy: the next summary carries it by its text
    alone = into_summary(template, Frontier(task=task, task_id="h1"), 600, kept={"h1"})
    assert KEPT_AFTER not in alone and "Fix the migration bug." in alone
    # the chars a pointer saves go to the facts, not to more frontier lines
    steps = tuple(
        f"step {k}: check the migration of app{k} against the renamed key" for k in range(9)
    )
    busy = Frontier(task=task, task_id="h1", latest=latest, latest_id="h7", open=steps)
    quoting = into_summary(template, busy, 600)
    pointing = into_summary(template, busy, 600, kept={"h7"})
    assert len(pointing) < len(quoting) - 100
    assert pointing.count("step ") == quoting.count("step ") > 0


def test_the_id_an_investigating_pointer_names_is_no_fact():
    # the pointer's message id was read back from the summary as an id and pinned again at
    # every later compaction (tau-bench at 4,000: "- ids: HAT208; 8858beca; c3fdb0e3")
    from offpath.compaction.frontier import KEPT_AFTER, QUOTED_BELOW, pointer_line
    from offpath.compaction.summary import build_summary_message

    for where in (QUOTED_BELOW, KEPT_AFTER):
        text = (
            f"**Investigating:** {pointer_line('8858beca', where)}\n**Key findings:**\n"
            "- HAT208 is booked\n**Ruled out:** none\n**Current state:** z"
        )
        summary = build_summary_message(
            message_id="s1",
            summary_text=text,
            replaced_ids=["a"],
            replaced_chars=10,
            summarizer="offline",
            compactions=1,
            request=None,
        )
        values = {f.value for f in extract([summary])}
        assert "HAT208" in values and "8858beca" not in values, values


def test_the_prompt_sizes_its_items_as_the_chunks_are_cut():
    """The prompt built for a plan carries each removed message's size as a chunk counts it
    (rendered with a 16-char boundary): cut from those sizes or rendered again, the chunks
    are the same, whether the removal fits one prompt or not."""
    from offpath.compaction.prompt import chunks
    from offpath.compaction.summary import is_summary

    msgs: list = [SystemMessage(id="sys", content="sys"), HumanMessage(id="h", content="Go.")]
    for i in range(60):
        cid = f"c{i}"
        msgs += [
            AIMessage(id=f"a{i}", content="", tool_calls=[{"id": cid, "name": "logs", "args": {}}]),
            ToolMessage(id=f"t{i}", content=f"MARK-{i:03d} " + "z " * 900, tool_call_id=cid),
        ]
    settings = load_settings(summarization_threshold_chars=100_000, summarization_keep_chars=10_000)
    plan = plan_compaction(msgs, settings)
    assert isinstance(plan, CompactionPlan)
    fresh = [m for m in plan.removed if not is_summary(m)]
    for max_chars in (20_000, 40_000, 400_000):
        prompt = build_prompt(plan, max_chars)
        assert prompt.sizes == tuple(len(render_message(m, "0" * 16)) + 2 for m in fresh)
        cut = chunks(plan, max_chars, MAX_CALLS, prompt.sizes)
        assert [p.removed for p in cut] == [p.removed for p in chunks(plan, max_chars, MAX_CALLS)]
    assert len(chunks(plan, 20_000, MAX_CALLS, build_prompt(plan, 20_000).sizes)) > 1


def pointing_at_h2(msgs):
    """A compaction prepared on ``msgs`` (removing h1, a1) whose Investigating line points at
    request h2 kept after the summary; with each message's size in chars."""
    from offpath.compaction.frontier import KEPT_AFTER, pointer_line
    from offpath.compaction.patch import Prepared

    text = (
        f"**Investigating:** {pointer_line('h2', KEPT_AFTER)}\n**Key findings:**\n- x\n"
        "**Ruled out:** none\n**Current state:** w"
    )
    sizes = {m.id: len(str(m.content)) for m in msgs}
    prepared = Prepared(
        job_id="j",
        summary_text=text,
        summarizer="offline",
        model="",
        request=None,
        compactions=1,
        removed=("h1", "a1"),
        order=tuple(m.id for m in msgs),
        chars=sizes,
        digests={},
        tool_calls={},
        total_chars=sum(sizes.values()),
        threshold_chars=1_000,
    )
    return prepared, sizes


def test_a_pointer_to_a_request_that_goes_at_the_apply_quotes_it_again():
    # the Investigating line points at a request kept after the summary; when the apply
    # takes that request too (its turn went whole, or the plan's copy stays out), the line
    # quotes the request's start again instead of pointing at nothing
    from offpath.compaction.frontier import KEPT_AFTER, pointer_line
    from offpath.compaction.patch import _assemble

    msgs = [
        HumanMessage(id="h1", content="Rotate the TLS certificate of ingress-gw-5."),
        AIMessage(id="a1", content="Done: rotated."),
        HumanMessage(id="h2", content="Now restore the DNS record of status-page-6."),
        AIMessage(id="a2", content="Restored."),
        HumanMessage(id="h3", content="Thanks, what else is open?"),
    ]
    prepared, sizes = pointing_at_h2(msgs)
    by_id = {m.id: m for m in msgs}
    kept = _assemble(prepared, msgs, by_id, ["h1", "a1"], "", True, None, sizes)
    assert pointer_line("h2", KEPT_AFTER) in str(kept.summary.content)
    gone = _assemble(prepared, msgs, by_id, ["h1", "a1", "h2", "a2"], "", True, None, sizes)
    content = str(gone.summary.content)
    assert KEPT_AFTER not in content
    assert 'Now restore the DNS record of status-page-6. (whole: recall("h2"))' in content


def test_a_pointer_quoted_again_at_the_apply_leaves_out_the_instructions_sent_with_every_request():
    # the request quoted again when its pointer's message goes at the apply is the user's own
    # words: the block an agent framework appends to every user message is named once by
    # the summary (Standing instructions), never as the request (it took ~100 chars of the
    # Investigating line from the facts)
    from offpath.compaction.patch import _assemble

    block = "Global Instructions (use if relevant): " + "always query the metrics store. " * 4
    msgs = [
        HumanMessage(id="h1", content=f"Rotate the TLS certificate of ingress-gw-5.\n\n{block}"),
        AIMessage(id="a1", content="Done: rotated."),
        HumanMessage(id="h2", content=f"Restore the DNS record of status-page-6.\n\n{block}"),
        AIMessage(id="a2", content="Restored."),
        HumanMessage(id="h3", content=f"Thanks, what else is open?\n\n{block}"),
    ]
    prepared, sizes = pointing_at_h2(msgs)
    by_id = {m.id: m for m in msgs}
    gone = _assemble(prepared, msgs, by_id, ["h1", "a1", "h2", "a2"], "", True, None, sizes)
    investigating = str(gone.summary.content).split("**Investigating:** ", 1)[1].split("\n")[0]
    assert investigating == 'Restore the DNS record of status-page-6. (whole: recall("h2"))'
