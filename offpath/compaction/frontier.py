"""The agent's place in the session, kept in every summary (DESIGN.md invariant 15).
Pure: no I/O.

After a compaction an agent must know what it was asked first, what it is doing now, what is
done and what is still open, or it goes back to an older task or reopens finished work (the
most common complaint about compaction: Codex issues #25686, #34095, #31659). A summarizer,
LLM or not, may lose that; so it is read from the messages themselves, deterministically:

* the **task**: the session's first request (or the one an earlier summary recorded);
* the **latest request** when it differs. A follow-up such as "continue" or "proceed" is no
  request of its own: it continues the one before it;
* what is **done**: a request the agent answered (a text reply with no tool call, not an
  interim report) before the next one came; the steps of the agent's plan it reported done;
* what is **open**, open first: a tool call still waiting for its result, a tool call that
  failed (``status="error"``: never recorded as done), the latest request while it is being
  worked on, the plan's steps not done (the one under way named);
* what is **next**: the agent's last stated next step;
* the **instructions in force**: a request that revises an earlier one ("actually, use prod
  instead") supersedes it;
* the **decisions**: what a user's message fixes (an approved wording, a chosen option, "do
  not touch X"), word for word, carried for the session's life under
  :data:`DECISIONS_HEADING`;
* the **standing instructions**: a block sent with every user message
  (:mod:`offpath.compaction.standing`), named once and never taken for a request.

:func:`read_frontier` builds a :class:`Frontier` from the removed and kept messages and the
frontier the last summary carried (its metadata); :func:`into_summary` writes it into the
seed's template: the **Investigating** line says the task (and the latest request), word for
word within a budget, and **Current state** gains the open, done and next lines. The next
compaction reads it back from the summary's text (:meth:`Frontier.from_text`), never from
its metadata, which a client can forge; the plan's steps are carried so.

The :class:`Frontier` and its forms: its JSON, and its lines in a summary's text
(:func:`into_summary` writes them into the seed's template, :meth:`Frontier.from_text` reads
them back), with clipped requests pointing at their message for ``recall``. Pure.

Reading where the session stands from its messages (:func:`read_frontier`): its requests
(follow-ups folded into the one before them, revisions as instructions in force), what the
agent answered, its numbered plan and the steps it reported done, the tool calls waiting or
failed, and its stated next step. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from offpath.compaction.accounting import content_text
from offpath.compaction.facts.sections import head_before
from offpath.compaction.fields import message_field
from offpath.compaction.standing import (
    read_standing,
    standing_blocks,
    standing_line,
    without_standing,
)
from offpath.compaction.summary import (
    HEADINGS,
    archived_as,
    cite,
    is_summary,
    looks_like_instruction,
)

MAX_ITEM_CHARS = 160
#: How :func:`into_summary` marks the task when a later request follows it.
_STATUS = re.compile(r"^ \((done|superseded: revised by a later request|earlier)\): (.+)$")


@dataclass(frozen=True, slots=True)
class Frontier:
    """Where the session stands (see the module doc). Texts are word for word, clipped only
    by :func:`into_summary`'s budget; ids name the messages they come from (``recall``)."""

    task: str | None = None
    task_id: str | None = None
    #: "done" (answered before the next request) or "revised" (a later request revises it)
    task_status: str | None = None
    latest: str | None = None
    latest_id: str | None = None
    done: tuple[str, ...] = ()
    open: tuple[str, ...] = ()
    next: str | None = None
    instructions: tuple[str, ...] = ()
    earlier: tuple[str, ...] = field(default=(), compare=False)  # done items carried
    #: the standing instructions sent with every user message (whole, or the quoted start an
    #: earlier summary named): shown once, never as a request (:mod:`offpath.compaction.standing`)
    standing: tuple[str, ...] = ()
    #: the values the user fixed, word for word (:data:`DECISIONS_HEADING`), oldest first
    decisions: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "task_id": self.task_id,
            "task_status": self.task_status,
            "latest": self.latest,
            "latest_id": self.latest_id,
            "done": list(self.done),
            "open": list(self.open),
            "next": self.next,
            "instructions": list(self.instructions),
            "standing": list(self.standing),
            "decisions": list(self.decisions),
        }

    @classmethod
    def from_text(cls, text: str, request: str | None = None) -> Frontier | None:
        """The frontier an earlier summary shows, read from its text (what the model saw):
        never from its metadata, which a client can forge. None when it
        shows none. ``request``: the request the summary quotes at its end
        (:func:`~offpath.compaction.summary.summary_request`), which an Investigating line
        pointing at it (:data:`QUOTED_BELOW`) stands for."""
        current = original = None
        status = None
        lists: dict[str, tuple[str, ...]] = {}
        decisions: list[str] = []
        in_decisions = False
        for line in text.splitlines():
            if line.startswith(DECISIONS_HEADING):
                in_decisions = True
                continue
            if in_decisions:
                if line.startswith(DECISION_MARK):
                    decisions.append(line[len(DECISION_MARK) :].strip())
                    continue
                in_decisions = False
            if line.startswith(HEADINGS[0]) and current is None:
                current = line[len(HEADINGS[0]) :].strip() or None
            elif line.startswith(ORIGINAL_HEADING) and original is None:
                found = _STATUS.match(line[len(ORIGINAL_HEADING) :])
                if found:
                    status = {
                        "done": "done",
                        "superseded: revised by a later request": "revised",
                    }.get(found.group(1))
                    original = found.group(2).strip() or None
            elif line.startswith(DONE_HEADING):
                lists["Done"] = tuple(
                    x.strip() for x in line[len(DONE_HEADING) :].split("; ") if x.strip()
                )
            else:
                for label in ("Open", "Next", "Instructions in force"):
                    if line.startswith(f"- {label}: "):
                        lists[label] = tuple(
                            x.strip() for x in line[len(label) + 4 :].split("; ") if x.strip()
                        )
        if current is None:
            return None
        current, current_id = _pointer(current)
        if (shown := _IN_VIEW.match(current)) is not None:
            current_id = shown["id"]
            if shown["where"] == QUOTED_BELOW and request:
                current = " ".join(request.split())
        original, original_id = _pointer(original) if original else (None, None)
        task, latest = (original, current) if original else (current, None)
        return cls(
            task=task,
            task_id=original_id if original else current_id,
            task_status=status if latest else None,
            latest=latest,
            latest_id=current_id if original else None,
            done=lists.get("Done", ()),
            open=lists.get("Open", ()),
            next=lists.get("Next", (None,))[0],
            instructions=lists.get("Instructions in force", ()),
            standing=read_standing(text),
            decisions=tuple(d for d in decisions if d),
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Frontier | None:
        """A frontier an earlier summary carried; None for none (or one that is not ours)."""
        if not isinstance(data, Mapping):
            return None

        def texts(key: str) -> tuple[str, ...]:
            value = data.get(key)
            return (
                tuple(str(x) for x in value if isinstance(x, str))
                if isinstance(value, list)
                else ()
            )

        def text(key: str) -> str | None:
            value = data.get(key)
            return value if isinstance(value, str) and value else None

        return cls(
            task=text("task"),
            task_id=text("task_id"),
            task_status=text("task_status"),
            latest=text("latest"),
            latest_id=text("latest_id"),
            done=texts("done"),
            open=texts("open"),
            next=text("next"),
            instructions=texts("instructions"),
            standing=texts("standing"),
            decisions=texts("decisions"),
        )


def one_line(text: str, limit: int = MAX_ITEM_CHARS) -> str:
    """``text`` on one line (whitespace runs made one space), cut at a word to at most
    ``limit`` chars with "..." when longer. The cut splits no value (an id, a URL: a run of
    ASCII chars): it ends at a space, before the run it would split, or after a char of a
    script written without spaces (CJK, Thai), whichever keeps more; so a request in such a
    script keeps its head rather than only "..."."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    cut = line[: limit - 3]  # at a word; with no space in it, before the word it splits
    head = cut.rsplit(" ", 1)[0] if " " in cut else head_before(line, limit - 3)
    unspaced = max((i + 1 for i, ch in enumerate(cut) if not ch.isascii()), default=0)
    return (cut[:unspaced] if unspaced > len(head) else head) + "..."


#: The line that keeps the session's first request when a later request is the current one.
ORIGINAL_HEADING = "**Original request**"
#: The line that lists what is done (after Current state's items).
DONE_HEADING = "**Done:**"
#: The heading of the values the user fixed (an approved wording, a chosen option, "do not
#: touch X"), each quoted word for word on a line of its own, after the Investigating lines.
DECISIONS_HEADING = "**Decisions** (fixed by the user, word for word):"
#: How a decision's line opens (its text follows, word for word on one line).
DECISION_MARK = "- "
#: Most decisions a summary lists (the newest), and most chars of one (a longer one is
#: clipped at a word, its message named for ``recall``).
MAX_DECISIONS = 12
MAX_DECISION_CHARS = 400


#: Where the request the Investigating line names is shown whole when it stays in view:
#: quoted under the summary's :data:`~offpath.compaction.summary.REQUEST_HEADING`, or kept as
#: among the messages after the summary (a long request's copy). The line then points at it
#: (``the request of message <id>, quoted at the end of this summary``) instead of repeating
#: its start.
QUOTED_BELOW = "quoted at the end of this summary"
KEPT_AFTER = "kept in view after this summary"
_IN_VIEW = re.compile(
    rf"^the request of message (?P<id>\S+), (?P<where>{QUOTED_BELOW}|{KEPT_AFTER})$"
)


def pointer_line(message_id: str, where: str) -> str:
    """The Investigating line's text for a request shown whole elsewhere in view (``where``:
    :data:`QUOTED_BELOW` or :data:`KEPT_AFTER`)."""
    return f"the request of message {cite(message_id)}, {where}"


#: A request an earlier summary clipped: its start and the id ``recall`` reads it whole by.
_POINTER = re.compile(r'^(?P<text>.*\.\.\.) \(whole: recall\("(?P<id>[^"]+)"\)\)$')


def _pointer(text: str) -> tuple[str, str | None]:
    """``(text, message id)`` of a clipped request with its ``recall`` pointer; ``(text,
    None)`` for a whole one."""
    found = _POINTER.match(text)
    return (found["text"], found["id"]) if found else (text, None)


def into_summary(
    text: str,
    frontier: Frontier,
    budget: int,
    quoted: str | None = None,
    kept: Collection[str] = (),
) -> str:
    """``text`` (a summary in the seed's template) with ``frontier`` written into it, in at
    most ``budget`` chars more than the template lines it replaces. **Investigating** says
    the current request, word for word: the task, or the latest request when it differs,
    with the task kept under :data:`ORIGINAL_HEADING` (marked done, superseded or earlier);
    **Current state** gains the open items (open first), the next step and the
    instructions in force, and :data:`DONE_HEADING` lists what is done. A text too long for
    the budget is clipped, naming its message (``recall`` reads it whole). A summary off the
    template is returned as it is.

    A request shown whole elsewhere in view is pointed at, not repeated
    (:func:`pointer_line`): the latest request (or the task when no later request differs)
    that the summary quotes at its end (``quoted``, the plan's request), or the latest
    request kept after the summary (``kept``: the ids of the requests the kept messages
    hold, the plan's request copy among them)."""
    lines = text.splitlines()
    inv = next((i for i, ln in enumerate(lines) if ln.startswith(HEADINGS[0])), None)
    cur = next((i for i, ln in enumerate(lines) if ln.startswith(HEADINGS[3])), None)
    if inv is None or cur is None:
        return text
    room = max(200, budget)
    # the request in progress gets the larger share: clipped, it loses what the agent is
    # doing ("Good, that one is finished. Now: Restore the DNS..."); the first request,
    # kept for the record, the smaller one
    latest_quote, quote = max(120, room // 2), max(80, room // 3)

    quoted_one = " ".join(quoted.split()) if quoted else None
    spared = 0  # chars a pointer saved: left to the facts, not to the other frontier lines

    def verbatim(value: str, mid: str | None, quote: int = quote, line: str = "") -> str:
        # ``line``: "latest" or "task", the Investigating line's request; a request kept as a
        # copy is pointed at only as the latest one (the task an earlier summary names is
        # carried by its text: it must read back whole once the copy is gone); a pointer
        # longer than the words it stands for is not taken
        nonlocal spared
        one = " ".join(value.split())
        pointer = None
        if mid and line and one == quoted_one:
            pointer = pointer_line(mid, QUOTED_BELOW)
        elif mid and line == "latest" and mid in kept:
            pointer = pointer_line(mid, KEPT_AFTER)
        if pointer is not None and len(pointer) < min(len(one), quote):
            spared += min(len(one), quote) - len(pointer)
            return pointer
        if len(one) <= quote:
            if mid and one.endswith("...") and not one.endswith("...."):
                return f'{one} (whole: recall("{cite(mid)}"))'  # clipped by an earlier summary
            return one
        cut = one[: quote - 40]
        cut = cut.rsplit(" ", 1)[0] if " " in cut else head_before(one, quote - 40)
        return f'{cut}... (whole: recall("{cite(mid)}"))' if mid else f"{cut}..."

    if frontier.task:
        same = frontier.latest is not None and (
            " ".join(frontier.latest.split()) == " ".join(frontier.task.split())
        )
        if frontier.latest and not same:  # the same request twice says nothing more
            status = {"done": "done", "revised": "superseded: revised by a later request"}.get(
                frontier.task_status or "", "earlier"
            )
            lines[inv] = (
                f"{HEADINGS[0]} "
                f"{verbatim(frontier.latest, frontier.latest_id, latest_quote, 'latest')}\n"
                f"{ORIGINAL_HEADING} ({status}): {verbatim(frontier.task, frontier.task_id)}"
            )
        else:
            lines[inv] = (
                f"{HEADINGS[0]} {verbatim(frontier.task, frontier.task_id, latest_quote, 'task')}"
            )
    left = room - sum(len(x) for x in lines[inv].splitlines()) - spared
    if frontier.decisions:  # word for word, outside the frontier's share: budget.ORDER
        lines[inv] += "\n" + "\n".join(
            [
                DECISIONS_HEADING,
                *(
                    DECISION_MARK + one_line(d, MAX_DECISION_CHARS)
                    for d in frontier.decisions[-MAX_DECISIONS:]
                ),
            ]
        )

    def fitting(items: Sequence[str]) -> list[str]:
        nonlocal left
        out: list[str] = []
        for item in items:
            entry = one_line(item)
            if len(entry) + 4 > left:
                break
            out.append(entry)
            left -= len(entry) + 4
        return out

    extra: list[str] = []
    if standing := standing_line(frontier.standing):
        extra.append(standing)
    # the Investigating line names the latest request: an open item says it is under way
    # without repeating it
    named = frontier.latest or frontier.task
    opened = [
        UNDER_WAY if named and item == f"{UNDER_WAY}: {one_line(named)}" else item
        for item in frontier.open
    ]
    for label, items in (
        ("Open", opened),
        ("Next", (frontier.next,) if frontier.next else ()),
        ("Instructions in force", frontier.instructions[-2:]),
    ):
        if kept_items := fitting(items):
            extra.append(f"- {label}: " + "; ".join(kept_items))
    if done := fitting(frontier.done[-5:]):
        extra.append(f"{DONE_HEADING} " + "; ".join(done))
    # the Current state section runs to the end of the template (a blank line or a note)
    end = cur + 1
    while end < len(lines) and lines[end].strip() and not lines[end].startswith("_"):
        end += 1
    return "\n".join([*lines[:end], *extra, *lines[end:]])


#: The open item of a latest request the agent has not answered yet (its text follows in
#: the frontier; a summary's Investigating line names it, the item does not repeat it).
UNDER_WAY = "the latest request is under way"
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
        requests.append((i, text, archived_as(m)))  # a request's copy: the request's id
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
            open_.append(f"{UNDER_WAY}: {one_line(text)}")
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
        call = next((c for c in message_field(m, "tool_calls") or [] if c.get("id") == cid), None)
        if call is not None:
            waiting.append(f"waiting for the result of {_call(call)}")
    failed: list[str] = []
    for a, t in pairing.pairs:
        result = messages[t]
        if isinstance(result, ToolMessage) and result.status == "error":
            ai = messages[a]
            calls = ai.tool_calls if isinstance(ai, AIMessage) else []
            call = next((c for c in calls if c.get("id") == result.tool_call_id), None)
            what = _call(call) if call else result.name or "a tool call"
            failed.append(
                f"FAILED, not done: {what}: {one_line(content_text(result.content), 100)}"
            )
    return [*waiting, *failed[-5:]]


def _call(call: Mapping[str, Any]) -> str:
    import json

    args = json.dumps(call.get("args") or {}, ensure_ascii=False, default=str)
    return f"{call.get('name')}({one_line(args, 100)})"


#: Code spans, and what is left of an item once they are gone.
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_WORD = re.compile(r"[^\W\d_]{3,}")


def _says_what(step: str) -> bool:
    """``step`` (a numbered item's text) says something to do: a word outside its code
    spans. ``1. `catalogue-f7687cb4-zsngc`:`` heads the details of one item of a report."""
    return _WORD.search(_CODE_SPAN.sub(" ", step)) is not None


def _plan(
    messages: Sequence[BaseMessage], carried: Mapping[int, tuple[str, str]] | None = None
) -> tuple[list[str], list[str]]:
    """The agent's latest plan (a numbered list of two steps or more in its text; else the one
    an earlier summary listed, ``carried``: step -> (text, status)): the steps it reported
    done, and the others, the one under way first."""
    carried = {n: step for n, step in (carried or {}).items() if _says_what(step[0])}
    plan: dict[int, str] = {n: text for n, (text, _) in carried.items()}
    status: dict[int, str] = {n: st for n, (_, st) in carried.items()}
    at = 0
    for i, m in enumerate(messages):
        if isinstance(m, AIMessage):
            steps = {
                int(n): s.strip()
                for n, s in _STEP.findall(content_text(m.content))
                if _says_what(s)
            }
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
