"""The summary message: how it looks, how it is recognised, what it carries.

A summary is a ``HumanMessage`` whose content is the seed's prefix line, a blank
line, then the summary text (the seed: "Replace old messages with one
HumanMessage containing the structured summary"). When a cut fell inside a turn,
that turn's request follows under :data:`REQUEST_HEADING`, word for word, unchanged
(issue 2, item 3).

It is marked in ``additional_kwargs`` so that a later compaction folds it into
the next summary instead of keeping two (issue 2, item 6)::

    additional_kwargs = {
        "lc_source": "summarization",
        "summary": {
            "replaced_ids": [...],        # ids of the messages this compaction removed
            "replaced_count": 14,
            "replaced_chars": 42000,     # chars they held (accounting.message_chars)
            "summarizer": "llm:gpt-4o-mini" | "offline",
            "compactions": 3,            # how many compactions this summary folds in
            "request": "..." | None,     # the open turn's request, word for word
            # and what the worker adds: job_id, model, input/output tokens, latency_ms
        },
    }
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage

from offpath.compaction.accounting import content_text

#: The first line of every summary message (the seed's checkpoint shows it).
SUMMARY_PREFIX = "[Context from earlier in this session, summarized]"
#: ``additional_kwargs["lc_source"]`` of a summary message.
SUMMARY_SOURCE = "summarization"
#: Heading of the quoted request of a turn that was cut in the middle.
REQUEST_HEADING = "**Request of the turn in progress (verbatim):**"
#: The summary's last line (issue 11, item 4: the summary tells the model the tool exists).
RECALL_NOTE = (
    "_The summarized messages are archived unchanged: the `recall` tool reads them again "
    "(words or a message id)._"
)


def overhead_chars(request: str | None) -> int:
    """Chars of a summary message that are not its text nor its pinned facts: the prefix line,
    the recall line, a quoted request with its heading, and the blank lines between them."""
    quoted = len(REQUEST_HEADING) + 3 + len(request) if request else 0
    return len(SUMMARY_PREFIX) + 2 + 2 + len(RECALL_NOTE) + quoted


#: The seed's template headings, in order; every summary must have them (issue 10, item 4).
HEADINGS = ("**Investigating:**", "**Key findings:**", "**Ruled out:**", "**Current state:**")

#: Lines that speak to an assistant rather than record a finding: injected instructions
#: (from tool output, a web page, a log line) that must not reach the summary, which the
#: model reads in the user's role.
_INSTRUCTION = re.compile(
    r"\b(ignore|disregard|forget|override)\b.{0,40}\b(instructions?|prompts?|rules|messages?|context)\b"
    r"|\byou are now\b|\bact as\b|\bnew instructions?\b|\bsystem prompt\b"
    r"|\b(operator|admin(istrator)?|system|developer) (note|notice|message|override|instruction)s?\b"
    r"|\bpriority[ :]*[0-9]\b|^\W*(system|assistant|developer)\s*:"
    r"|<\|?(im_start|im_end|system|assistant)\|?>",
    re.IGNORECASE,
)


def template_problem(text: str) -> str | None:
    """What is wrong with a summary's text against the seed's template (its four headings, in
    order, the first one first), or None."""
    body = text.strip()
    at = -1
    for heading in HEADINGS:
        found = body.find(heading, at + 1)
        if found < 0:
            return f"it has no {heading} heading"
        if found < at:
            return "its headings are out of order"
        at = found
    if not body.startswith(HEADINGS[0]):
        return f"it does not start with {HEADINGS[0]}"
    return None


#: Every alternative of :data:`_INSTRUCTION` holds one of these (case-folded): a text with
#: none of them holds no instruction, found with C substring scans instead of the regex
#: (issue 13: the fact guard tests each line that holds a fact).
_INSTRUCTION_WORDS = (
    "ignor", "disregard", "forget", "overrid", "you are now", "act as", "new instruction",
    "system", "operator", "admin", "developer", "priority", "assistant", "im_",
)  # fmt: skip


def may_hold_instruction(text: str) -> bool:
    """False when no line of ``text`` can look like an instruction (none of the words the
    wording needs is in it, in any case); True means: test the lines."""
    folded = text.casefold()
    if "\u0131" in folded or "\u0307" in folded:  # dotless i, and İ folded to i + dot above:
        folded = folded.replace("\u0131", "i").replace("i\u0307", "i")  # the regex takes both
    return any(word in folded for word in _INSTRUCTION_WORDS)


def looks_like_instruction(line: str) -> bool:
    """The line addresses an assistant (an injected instruction), by its wording."""
    return may_hold_instruction(line) and bool(_INSTRUCTION.search(line))


def strip_instructions(text: str) -> tuple[str, int]:
    """``text`` without the lines that look like injected instructions, and how many there were."""
    kept, dropped = [], 0
    for line in text.splitlines():
        if looks_like_instruction(line):
            dropped += 1
        else:
            kept.append(line)
    return "\n".join(kept), dropped


def text_cap(summary_chars: int) -> int | None:
    """Most chars a summarizer's text may use when the summary's text and pinned facts share
    ``summary_chars`` (``CompactionPlan.summary_chars``; 0: no bound): two thirds, the rest
    is left to the fact guard's Pinned facts."""
    return max(400, summary_chars * 2 // 3) if summary_chars else None


def words_for(chars: int | None) -> int:
    """The word limit a summarizer is given for ``chars`` chars of text (the seed's 400 words,
    fewer on a small budget; about 7 chars a word)."""
    return 400 if chars is None else max(60, min(400, chars // 7))


def fit_text(text: str, cap: int | None) -> str:
    """``text`` (a summary in the seed's template) in at most ``cap`` chars: the last Key
    findings bullets go first, then every line is clipped; the four headings always stay.
    Returns it unchanged when it fits (or ``cap`` is None)."""
    if cap is None or len(text) <= cap:
        return text
    lines = text.splitlines()
    bullets = [i for i, line in enumerate(lines) if line.lstrip().startswith("- ")]
    while bullets and len("\n".join(lines)) > cap:
        del lines[bullets.pop()]
    if len("\n".join(lines)) <= cap:
        return "\n".join(lines)
    # then lines that are neither a heading nor a finding (notes, blank lines), then clip
    lines = [ln for ln in lines if ln.startswith(HEADINGS) or ln.lstrip().startswith("- ")]
    while len("\n".join(lines)) > cap:
        longest = max(range(len(lines)), key=lambda i: len(lines[i]))
        line = lines[longest]
        heading = next((h for h in HEADINGS if line.startswith(h)), "")
        room = max(len(heading), len(line) - (len("\n".join(lines)) - cap) - 3)
        if room >= len(line) - 3:  # nothing more to clip: the headings alone
            break
        lines[longest] = line[:room].rstrip() + "..." if room > len(heading) else heading
    return "\n".join(lines)


def is_summary(message: BaseMessage) -> bool:
    """True when ``message`` carries the summary marker: ``lc_source: "summarization"`` in
    ``additional_kwargs`` (what offpath writes), or ``summary: true`` (the cases' format
    for a summary imported from elsewhere).

    Only the marker counts, never the text: a user message that happens to open with
    :data:`SUMMARY_PREFIX` (a pasted note) is a request like any other (issue 8, item 9;
    the ``prefix-in-user-text`` case). A marked message is folded into the next summary,
    but what its metadata claims (job id, replaced counts) is never trusted: offpath
    counts usage only from its own job records (DESIGN.md invariant 10).
    """
    if message.type != "human":
        return False
    extra = message.additional_kwargs
    return extra.get("lc_source") == SUMMARY_SOURCE or extra.get("summary") is True


def summary_meta(message: BaseMessage) -> Mapping[str, Any]:
    """The metadata dict of a summary message (empty for one without it)."""
    meta = message.additional_kwargs.get("summary")
    return meta if isinstance(meta, Mapping) else {}


def fingerprint(message: BaseMessage) -> str:
    """SHA-256 of a message's content: with its id, how a job's stored result recognises the
    summary it patched in (a client's copy of the marker does not match it)."""
    return hashlib.sha256(content_text(message.content).encode()).hexdigest()


def summary_body(message: BaseMessage) -> str:
    """The summary text of a summary message, without the prefix line and quoted request."""
    content = content_text(message.content)
    body = content.removeprefix(SUMMARY_PREFIX).strip()
    head, sep, _ = body.partition(REQUEST_HEADING)
    return head.strip() if sep else body


def build_summary_message(
    *,
    message_id: str,
    summary_text: str,
    replaced_ids: list[str],
    replaced_chars: int,
    summarizer: str,
    compactions: int,
    request: str | None,
    extra: Mapping[str, Any] | None = None,
) -> HumanMessage:
    """The summary ``HumanMessage``; it takes ``message_id``, the first removed message's id.

    Taking that id is what puts it first: ``add_messages`` replaces a message
    with a known id in place, and appends one with a new id at the end
    (DESIGN.md invariant 2).
    """
    content = f"{SUMMARY_PREFIX}\n\n{summary_text.strip()}"
    if request:
        content += f"\n\n{REQUEST_HEADING}\n{request}"
    return HumanMessage(
        id=message_id,
        content=content,
        additional_kwargs={
            "lc_source": SUMMARY_SOURCE,
            "summary": {
                "replaced_ids": list(replaced_ids),
                "replaced_count": len(replaced_ids),
                "replaced_chars": replaced_chars,
                "summarizer": summarizer,
                "compactions": compactions,
                "request": request,
                **(extra or {}),
            },
        },
    )
