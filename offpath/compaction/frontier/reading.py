"""Reading where the session stands from its messages (:func:`read_frontier`): its requests
(follow-ups folded into the one before them, revisions as instructions in force), what the
agent answered, its numbered plan and the steps it reported done, the tool calls waiting or
failed, and its stated next step. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from offpath.compaction.accounting import content_text
from offpath.compaction.frontier.form import Frontier, one_line
from offpath.compaction.standing import standing_blocks, without_standing
from offpath.compaction.summary.instructions import looks_like_instruction
from offpath.compaction.summary.message import is_summary

#: A human message that only says to go on: it continues the request before it.
FOLLOW_UP = re.compile(
    r"^\W*(?:(?:ok(?:ay)?|yes|yep|sure|great|good|thanks?|thank you|please|alright|right)\W+)*"
    r"(?:continue|proceed|go on|go ahead|keep going|carry on|resume|next|do it|go|"
    r"ok(?:ay)?|yes|yep|sure|sounds good|thanks?|thank you|great|good|alright)"
    r"(?:\W+(?:please|then|with it|on|thanks?))*\W*$",
    re.IGNORECASE,
)
#: A request that revises an earlier instruction.
REVISION = re.compile(
    r"\b(?:actually|instead|rather than|scratch that|change of plans?|correction|on second "
    r"thought|update:|from now on|for the rest of|going forward|no longer|no,? (?:use|do|don't|"
    r"make|switch)|don'?t use|do not use|switch to|not \w+ but)",
    re.IGNORECASE,
)
#: A numbered step of a plan in the agent's text: "1. ...", "Step 2: ...", "3) ...".
_STEP = re.compile(r"^\s*(?:[-*]\s*)?(?:\*\*)?(?:step\s*)?(\d{1,2})[.):]\**\s+(.+)$", re.I | re.M)
_CHECKED = re.compile(r"\[[xX✓]\]|✓|✅|~~")
_DONE_WORDS = r"(?:done|complete[d]?|finished|fixed|verified|succeeded|resolved|✓|✅)"
_UNDER_WAY = r"(?:now|next|starting|start|working on|moving (?:on )?to|on to|under way|begin)"
#: The agent's next step, as it says it.
_NEXT = re.compile(
    r"(?:^|(?<=[.!?]\s))[^.!?\n]*\b(?:next,? I(?:'ll| will)|I(?:'ll| will) now|next step|"
    r"then I(?:'ll| will)|next:|now I(?:'ll| will)|let me)\b[^.!?\n]*[.!?]?",
    re.IGNORECASE,
)
#: A step of a plan as a summary lists it ("step 4 (under way): ...").
_LISTED_STEP = re.compile(r"^step (\d{1,2})(?: \((?:under way|done)\))?: (.+)$")


def is_follow_up(text: str) -> bool:
    """``text`` only says to go on ("continue", "ok, proceed", "yes please")."""
    return bool(FOLLOW_UP.match(text.strip())) or not text.strip()


def read_frontier(
    removed: Sequence[BaseMessage],
    kept: Sequence[BaseMessage] = (),
    earlier: Frontier | None = None,
) -> Frontier:
    """Where the session stands at this compaction, from the messages it removes and keeps
    (in thread order) and the frontier the last summary carried (``earlier``)."""
    messages = [m for m in (*removed, *kept) if not is_summary(m)]
    # the standing instructions every user message carries: never a request
    standing = standing_blocks(messages, earlier.standing if earlier else ())
    # requests, follow-ups folded into the one before them
    requests: list[tuple[int, str, str]] = []  # (index, text, message id)
    decisions: list[str] = list(earlier.decisions) if earlier else []
    for i, m in enumerate(messages):
        if m.type != "human":
            continue
        text = without_standing(content_text(m.content), standing)
        if not text or is_follow_up(text) or looks_like_instruction(text):
            continue
        if requests and requests[-1][1] == text:  # a kept request's copy
            continue
        requests.append((i, text, str(m.id)))
        if (fixed := decision_of(text)) and " ".join(fixed.split()) not in decisions:
            decisions.append(" ".join(fixed.split()))
    task = earlier.task if earlier and earlier.task else None
    task_id = earlier.task_id if earlier and earlier.task else None
    if task is None and requests:
        _, task, task_id = requests[0]
    task_status = earlier.task_status if earlier and earlier.task else None
    done: list[str] = list(earlier.done) if earlier else []
    open_: list[str] = []
    instructions: list[str] = []
    # each request: done when the agent answered it before the next one came
    for k, (i, text, _) in enumerate(requests):
        end = requests[k + 1][0] if k + 1 < len(requests) else len(messages)
        answered = any(_is_final_answer(m) for m in messages[i + 1 : end])
        last = k + 1 == len(requests)
        if REVISION.search(text):
            instructions.append(text)
            if not task_status and text != task:
                task_status = "revised"
        if not last:
            if text == task:
                task_status = task_status or ("done" if answered else None)
            else:
                done.append(
                    one_line(text, 80) + (" (done: answered)" if answered else " (superseded)")
                )
        elif not answered and text != task:
            open_.append(f"the latest request is under way: {one_line(text)}")
    if earlier and earlier.instructions:
        instructions = [*earlier.instructions, *instructions]
    latest = latest_id = None
    if requests and requests[-1][1] != task:
        _, latest, latest_id = requests[-1]
    elif earlier and earlier.latest and not requests:
        latest, latest_id = earlier.latest, earlier.latest_id
    # the agent's plan (or the one an earlier summary listed), the calls waiting or failed,
    # its next step
    carried_plan: dict[int, tuple[str, str]] = {}
    if earlier:
        for status, items in (("done", earlier.done), ("", earlier.open)):
            for item in items:
                if step := _LISTED_STEP.match(item):
                    carried_plan[int(step.group(1))] = (step.group(2), status)
        done = [d for d in done if not _LISTED_STEP.match(d)]
    steps_done, steps_open = _plan(messages, carried_plan)
    done += steps_done
    open_ = [*_calls(messages), *steps_open, *open_]
    next_step = _next(messages) or (earlier.next if earlier else None)
    return Frontier(
        task=task,
        task_id=task_id,
        task_status=task_status if latest else None,
        latest=latest,
        latest_id=latest_id,
        done=tuple(dict.fromkeys(done)),
        open=tuple(dict.fromkeys(open_)),
        next=next_step,
        instructions=tuple(dict.fromkeys(instructions))[-3:],
        standing=standing or (earlier.standing if earlier else ()),
        decisions=tuple(decisions),
    )


def _is_answer(m: BaseMessage) -> bool:
    return isinstance(m, AIMessage) and not m.tool_calls and bool(content_text(m.content).strip())


#: An agent's text that reports progress rather than an end: a question back, "so far".
_INTERIM = re.compile(
    r"\?\s*$|\b(?:so far|interim|not yet|still (?:working|checking|looking|investigating)|"
    r"(?:shall|should) I (?:continue|go on|proceed|carry on)|I will carry on|to be continued)\b",
    re.IGNORECASE,
)


def _is_final_answer(m: BaseMessage) -> bool:
    """``m`` answers a request and shows it done: a text reply with no tool call that is not
    an interim report (a question back, "so far", "shall I continue?")."""
    return _is_answer(m) and not _INTERIM.search(content_text(m.content).strip())


#: A user's message that fixes a value: an approval, a wording or name given to use as it is,
#: a "do not touch X" (:data:`DECISION` adds the weaker forms).
DECISION_STRONG = re.compile(
    r"\b(?:approved?|I approve|(?:do not|don'?t|never) (?:touch|change|modify|edit|rename|delete|"
    r"remove|upgrade|restart|deploy|merge|push)|exact(?:ly)? (?:this|these|as written|the "
    r"(?:title|wording|text|name))|use exactly|word for word|verbatim|keep (?:it|the \w+) as is|"
    r"(?:title|wording|subject line|commit message|branch name) (?:should|must|will) be)\b",
    re.IGNORECASE,
)
#: ... and a chosen option, a "use X, not Y", a name given.
DECISION = re.compile(
    DECISION_STRONG.pattern
    + r"|\b(?:go(?:ing)? with|stick (?:with|to)|let'?s go with|we(?:'ll| will) go with|"
    r"I(?:'ll| will)? (?:choose|pick|prefer)|use [^.,;\n]{1,60}?,? (?:not|instead of|rather "
    r"than)|call it|name it|option [A-Z0-9])\b",
    re.IGNORECASE,
)
#: Most chars of a message kept whole as a decision; in a longer one (a task brief, a pasted
#: file), the sentences that fix a value in the strong forms (:data:`DECISION_STRONG`).
DECISION_MESSAGE_CHARS = 400


def decision_of(text: str) -> str | None:
    """The part of a user's request ``text`` that fixes a value, word for word: the whole
    text up to :data:`DECISION_MESSAGE_CHARS` when :data:`DECISION` matches it, else its
    sentences (or lines) that :data:`DECISION_STRONG` matches; None when it fixes none."""
    if not DECISION.search(text) or looks_like_instruction(text):
        return None
    if len(text) <= DECISION_MESSAGE_CHARS:
        return text
    parts = [p for p in re.split(r"(?<=[.!?])\s+|\n", text) if p.strip()]
    fixed = [p.strip() for p in parts if DECISION_STRONG.search(p)]
    return " ".join(fixed) or None


def _calls(messages: Sequence[BaseMessage]) -> list[str]:
    """Tool calls still waiting for their result, then calls that failed."""
    from offpath.compaction.pairing import pair_messages

    pairing = pair_messages(messages)
    waiting: list[str] = []
    for index, cid in pairing.open_calls:
        m = messages[index]
        call = next((c for c in getattr(m, "tool_calls", None) or [] if c.get("id") == cid), None)
        if call is not None:
            waiting.append(f"waiting for the result of {_call(call)}")
    failed: list[str] = []
    for a, t in pairing.pairs:
        result = messages[t]
        if isinstance(result, ToolMessage) and result.status == "error":
            call = next(
                (c for c in messages[a].tool_calls if c.get("id") == result.tool_call_id), None
            )
            what = _call(call) if call else result.name or "a tool call"
            failed.append(
                f"FAILED, not done: {what}: {one_line(content_text(result.content), 100)}"
            )
    return [*waiting, *failed[-5:]]


def _call(call: Mapping[str, Any]) -> str:
    import json

    args = json.dumps(call.get("args") or {}, ensure_ascii=False, default=str)
    return f"{call.get('name')}({one_line(args, 100)})"


def _plan(
    messages: Sequence[BaseMessage], carried: Mapping[int, tuple[str, str]] | None = None
) -> tuple[list[str], list[str]]:
    """The agent's latest plan (a numbered list of two steps or more in its text; else the one
    an earlier summary listed, ``carried``: step -> (text, status)): the steps it reported
    done, and the others, the one under way first."""
    plan: dict[int, str] = {n: text for n, (text, _) in (carried or {}).items()}
    status: dict[int, str] = {n: st for n, (_, st) in (carried or {}).items()}
    at = 0
    for i, m in enumerate(messages):
        if isinstance(m, AIMessage):
            steps = {int(n): s.strip() for n, s in _STEP.findall(content_text(m.content))}
            if len(steps) >= 2 and 1 in steps:
                plan, at = steps, i
                status = {n: "done" if _CHECKED.search(x) else "" for n, x in steps.items()}
    if not plan:
        return [], []
    for m in messages[at:]:
        if not isinstance(m, AIMessage):
            continue
        text = content_text(m.content)
        for n in plan:
            mention = rf"(?:step\s*{n}\b|\({n}\)|#{n}\b)"
            if re.search(
                rf"{mention}[^.\n]{{0,60}}\b{_DONE_WORDS}|\b{_DONE_WORDS}\b[^.\n]{{0,20}}{mention}",
                text,
                re.I,
            ):
                status[n] = "done"
            elif status[n] != "done" and re.search(
                rf"\b{_UNDER_WAY}\b[^.\n]{{0,30}}{mention}|{mention}[^.\n]{{0,30}}\b{_UNDER_WAY}\b",
                text,
                re.I,
            ):
                status[n] = "under way"
    done = [
        f"step {n} (done): {one_line(plan[n], 100)}" for n in sorted(plan) if status[n] == "done"
    ]
    last_done = max((n for n in plan if status[n] == "done"), default=0)
    current = next(
        (n for n in sorted(plan) if status[n] == "under way"),
        next((n for n in sorted(plan) if n > last_done and status[n] != "done"), None),
    )
    open_ = []
    for n in sorted(plan):
        if status[n] == "done":
            continue
        label = " (under way)" if n == current else ""
        open_.append(f"step {n}{label}: {one_line(plan[n], 100)}")
    if current is not None:  # the one under way first
        open_.sort(key=lambda s: not s.startswith(f"step {current} "))
    return done, open_


def _next(messages: Sequence[BaseMessage]) -> str | None:
    for m in reversed(messages):
        if isinstance(m, AIMessage):
            text = content_text(m.content)
            if not text.strip():
                continue
            found = [x.group(0).strip() for x in _NEXT.finditer(text)]
            found = [x for x in found if not looks_like_instruction(x)]
            return one_line(found[-1], 200) if found else None
    return None
