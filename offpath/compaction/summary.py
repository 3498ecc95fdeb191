"""The summary message: how it looks, how it is recognised, what it carries.

A summary is a ``HumanMessage`` whose content is the seed's prefix line, a blank
line, then the summary text (the seed: "Replace old messages with one
HumanMessage containing the structured summary"). When a cut fell inside a turn,
that turn's request follows under :data:`REQUEST_HEADING`, word for word, unchanged.

It is marked in ``additional_kwargs`` so that a later compaction folds it into
the next summary instead of keeping two::

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

The summary message itself: its prefix line, marker and metadata, the seed's template its
text follows (the headings, the check against them, the text's budget and how a text is
fitted into it), how it cites a message id, how it is built (:func:`build_summary_message`)
and recognised (:func:`is_summary`), and what is read back from it.

The filter that keeps injected instructions out of a summary: lines that speak to an
assistant rather than record a finding (:func:`looks_like_instruction`, :func:`strip_instructions`), read after
:func:`normalized` undoes the masks (NFKC, invisible and look-alike chars, spaced-out letters),
with cheap gates so most text is passed over by substring scans.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterator, Mapping
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage

from offpath.compaction.accounting import content_text

#: The first line of every summary message (the seed's checkpoint shows it).
SUMMARY_PREFIX = "[Context from earlier in this session, summarized]"
#: ``additional_kwargs["lc_source"]`` of a summary message.
SUMMARY_SOURCE = "summarization"
#: Heading of the quoted request of a turn that was cut in the middle: the turn the kept
#: messages start in, which may be answered by now (the frontier's lines say whether it is
#: done; "of the turn in progress" named a finished turn when the thread had gone on).
REQUEST_HEADING = "**Request of the turn the kept messages start in (verbatim):**"
#: The heading earlier summaries used for it, still read back (:func:`summary_request`).
OLD_REQUEST_HEADINGS = ("**Request of the turn in progress (verbatim):**",)
#: The summary's last line (the summary tells the model the tool exists).
RECALL_NOTE = "_The originals are archived: `recall` reads them (words or a message id)._"

#: A LangGraph message id (a UUID), which a summary cites by its first 8 hex chars.
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: How many leading hex chars of a UUID a citation keeps (``recall`` resolves them).
CITED_UUID_CHARS = 8


#: ``additional_kwargs`` key of the copy of a long request kept as its own message after a
#: summary: the id of the request message it copies. The copy takes the id of the message
#: the summary's cut removed second, so its original is archived under the request's id.
REQUEST_COPY = "offpath_request_of"


def archived_as(message: BaseMessage) -> str:
    """The id ``message``'s original is archived under, and that a summary cites it by
    (``recall`` reads the first row archived under an id): the request's for a request's
    copy (:data:`REQUEST_COPY`; the first row under the copy's own id is the message whose
    place it took), else its own."""
    copied = message.additional_kwargs.get(REQUEST_COPY)
    return copied if isinstance(copied, str) and copied else str(message.id)


def cite(message_id: str) -> str:
    """``message_id`` as a summary, a pinned fact or a shortened result names it: a UUID (the
    ids LangGraph gives messages) by its first :data:`CITED_UUID_CHARS` hex chars, any other id
    whole. ``recall`` resolves such a prefix within the thread
    (:func:`offpath.agent.recall.answer`). A 36-char id per pinned entry would take a third
    of a small summary's budget from the facts."""
    if _UUID.fullmatch(message_id):
        return message_id[:CITED_UUID_CHARS]
    return message_id


def overhead_chars(request: str | None) -> int:
    """Chars of a summary message that are not its text nor its pinned facts: the prefix line,
    the recall line, a quoted request with its heading, and the blank lines between them."""
    quoted = len(REQUEST_HEADING) + 3 + len(request) if request else 0
    return len(SUMMARY_PREFIX) + 2 + 2 + len(RECALL_NOTE) + quoted


#: The seed's template headings, in order; every summary must have them.
HEADINGS = ("**Investigating:**", "**Key findings:**", "**Ruled out:**", "**Current state:**")


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


#: A model declining the task in its own voice ("I'm sorry, but I can't help with that"),
#: written inside the template's headings or instead of them.
_REFUSAL = re.compile(
    r"\b(?:I(?:'m| am) sorry|I apologi[sz]e|Unfortunately)\b[^.\n]{0,80}?\b(?:can(?:no|')t|"
    r"unable|not able|won'?t)\b"
    r"|\bI (?:can(?:no|')t|am unable to|'m unable to|won'?t|will not|am not able to) "
    r"(?:help|assist|comply|provide|summari[sz]e|do that|fulfil|complete|continue)\b"
    r"|\bAs an AI(?: language model)?\b",
    re.IGNORECASE,
)


def refusal_problem(text: str) -> str | None:
    """A summary whose body is a model's refusal (its own words declining the task, with
    little else): what to say of it, or None. A finding that quotes a tool's "cannot connect"
    is not one: the refusal is in the first person, and most of the body says nothing else."""
    body = text
    for heading in HEADINGS:
        body = body.replace(heading, "")
    found = _REFUSAL.search(body)
    if found is None:
        return None
    rest = _REFUSAL.sub("", body)
    words = len(re.findall(r"[A-Za-z0-9]{3,}", rest))
    if words > 60:  # a real summary that happens to quote such words
        return None
    return f"the model declined the task ({found.group(0)!r})"


def text_cap(summary_chars: int) -> int | None:
    """Most chars a summarizer's text may use when the summary's text and pinned facts share
    ``summary_chars`` (``CompactionPlan.summary_chars``; 0: no bound): two thirds, the rest
    is left to the fact guard's Pinned facts."""
    return max(400, summary_chars * 2 // 5) if summary_chars else None


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
        # a line clipped to a few words says nothing ("**Ruled out:** not..."): its heading
        lines[longest] = line[:room].rstrip() + "..." if room > len(heading) + 16 else heading
    return "\n".join(lines)


def is_summary(message: BaseMessage) -> bool:
    """True when ``message`` carries the summary marker: ``lc_source: "summarization"`` in
    ``additional_kwargs`` (what offpath writes), or ``summary: true`` (the cases' format
    for a summary imported from elsewhere).

    Only the marker counts, never the text: a user message that happens to open with
    :data:`SUMMARY_PREFIX` (a pasted note) is a request like any other (the ``prefix-in-user-text``
    case). A marked message is folded into the next summary,
    but what its metadata claims (job id, replaced counts) is never trusted: offpath
    counts usage only from its own job records (DESIGN.md invariant 10).
    """
    if message.type != "human":
        return False
    extra = message.additional_kwargs
    return extra.get("lc_source") == SUMMARY_SOURCE or extra.get("summary") is True


def summary_meta(message: BaseMessage) -> Mapping[str, Any]:
    """The metadata dict of a summary message (empty for one without it). A client can send
    any of it: read it as data (:func:`compactions_of`, :func:`summary_request`)."""
    meta = message.additional_kwargs.get("summary")
    return meta if isinstance(meta, Mapping) else {}


#: Most compactions a summary may claim to fold in (more is taken for a forged count).
MAX_COMPACTIONS = 1_000_000


def compactions_of(message: BaseMessage) -> int:
    """How many compactions an earlier summary folds in: its metadata's ``compactions`` when
    that is a whole number from 1 to :data:`MAX_COMPACTIONS`, else 1. A client's marker
    said ``"abc"`` or ``2**64-1``, and every job of the session failed."""
    value = summary_meta(message).get("compactions", 1)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_COMPACTIONS:
        return value
    return 1


def summary_request(message: BaseMessage) -> str | None:
    """The request a summary quotes under :data:`REQUEST_HEADING`, read from its text (what
    the model saw, in the user's role), never from its metadata, which a client may forge
    (``additional_kwargs`` never reach a summary)."""
    content = content_text(message.content)
    for heading in (REQUEST_HEADING, *OLD_REQUEST_HEADINGS):
        _, sep, request = content.partition(f"\n\n{heading}\n")
        if sep:
            return request.strip() or None
    return None


def fingerprint(message: BaseMessage) -> str:
    """SHA-256 of a message's content: with its id, how a job's stored result recognises the
    summary it patched in (a client's copy of the marker does not match it)."""
    return hashlib.sha256(content_text(message.content).encode()).hexdigest()


def summary_body(message: BaseMessage) -> str:
    """The summary text of a summary message, without the prefix line and quoted request."""
    content = content_text(message.content)
    body = content.removeprefix(SUMMARY_PREFIX).strip()
    for heading in (REQUEST_HEADING, *OLD_REQUEST_HEADINGS):
        head, sep, _ = body.partition(heading)
        if sep:
            return head.strip()
    return body


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


#: Who a line may address: an AI system, by any of its names.
_AI = (
    r"(?:ai|a\.i\.|assistant|llm|language model|model|agent|chat ?bot|bot|gpt|claude|summari[sz]er)"
)
#: Words the case-folded line must hold for :data:`_AI` to match in it (and with the space
#: before them, for the rules that put whitespace there).
_AI_WORDS = ("ai", "a.i.", "assistant", "llm", "model", "agent", "bot", "gpt", "claude", "summari")
_SPACE_AI = tuple(f" {word}" for word in _AI_WORDS)
#: Where a line's own words start: the line's start, or just inside a quote or bracket.
_OPENING = r"(?:^|(?<=[\"'(\[{<]))\W*"

#: Lines that speak to an assistant rather than record a finding: injected instructions
#: (from tool output, a web page, a log line) that must not reach the summary, which the
#: model reads in the user's role. Each rule is ``(gate, pattern)``: the pattern can only
#: match a line whose :func:`normalized`, case-folded text holds, for each group of the
#: gate, one of its words (so most text is passed over by C substring scans: the
#: fact guard tests every line that holds a fact). Besides the wording of commands,
#: role-like line prefixes (``Human:``, ``System:``...), notes and greetings addressed to
#: an AI and claims of what the user approved count.
_RULES: tuple[tuple[tuple[tuple[str, ...], ...], str], ...] = (
    (
        (("ignor", "disregard", "forget", "overrid", "overrul", "neglect", "abandon",
          "set aside", "follow", "no attention"),),
        r"\b(ignore|disregard|forget|override|overrule|neglect|abandon|set aside|stop following"
        r"|pay no attention to|do not follow|don't follow)\b.{0,40}"
        r"\b(instructions?|prompts?|rules|messages?|context|directions?|directives?|guidance"
        r"|guidelines|orders|commands|polic(?:y|ies)|constraints)\b",
    ),
    (
        ((" as", "you are now"), ("you are now", "act as", "behave as", "respond as",
                                  "pretend as", "roleplay as")),
        r"\byou are now\b|\b(act|behave|respond|pretend|roleplay) as\b",
    ),
    (
        (("new ", "system prompt"), ("new instruction", "new rule", "new directive",
                                     "new order", "system prompt")),
        r"\bnew (instructions?|rules|directives?|orders)\b|\bsystem prompt\b",
    ),
    (
        (("operator", "admin", "system", "developer"),),
        r"\b(operator|admin(istrator)?|system|developer) "
        r"(note|notice|message|override|instruction|directive|command)s?\b",
    ),
    ((("priority",),), r"\bpriority[ :]*[0-9]\b"),
    ((("inst]", "sys>"),), r"\[/?inst\]|<</?sys>>"),
    (
        (("the user",),),
        r"\bthe user('s)?\s+(has\s+|have\s+|had\s+)?(already\s+|explicitly\s+|now\s+)?"
        r"(approved|authori[sz]ed|confirmed|consented|granted|agreed|permitted|allowed"
        r"|instructed)\b",
    ),
    (
        (("do not",),),
        r"\bdo not (tell|inform|alert|notify|mention|reveal|report)\b.{0,30}"
        r"\b(user|anyone|operator|human|admin)",
    ),
    # a role-like line prefix (a "Human:" line must not be pinned), at a line's
    # start or a quote's (a header or a bullet that quotes one)
    (
        ((":",), ("system:", "assistant:", "developer:", "human:", "user:", "ai:",
                  "instruction:", "instructions:")),
        rf"{_OPENING}(system|assistant|developer|human|user|ai|instructions?)\s*:",
    ),
    (
        (("<",), ("<im_", "<|im_", "<system", "<|system", "<assistant", "<|assistant",
                  "<user", "<|user", "<endoftext", "<|endoftext")),
        r"<\|?(im_start|im_end|system|assistant|user|endoftext)\|?>",
    ),
    (
        (("##",), ("instruction", "system", "response")),
        rf"{_OPENING}#{{2,}}\s*(instruction|system|response)",
    ),
    (
        ((" to ", " for "), ("note", "message", "memo", "reminder", "instruction", "request",
                             "attention", "warning", "notice"), _SPACE_AI),
        rf"\b(note|message|memo|reminder|instructions?|request|attention|warning|notice)\s+"
        rf"(to|for)\s+(the\s+|any\s+|all\s+)?{_AI}s?\b",
    ),
    (
        (("dear", "hey", "hello", "attention", "attn"), _AI_WORDS),
        rf"{_OPENING}(dear|hey|hello|attention|attn)\W+{_AI}\b",
    ),
    (
        ((" must", " should", " shall", " need", " has to", " is required to",
          " is instructed to", " will now"), _AI_WORDS),
        rf"\b{_AI}s?\s+(must|should|shall|needs? to|has to|is required to|is instructed to"
        r"|will now)\b",
    ),
)  # fmt: skip
_COMPILED = tuple((gate, re.compile(p, re.IGNORECASE | re.MULTILINE)) for gate, p in _RULES)
#: The whole wording rule as one pattern (the rules are run one by one, gated).
_INSTRUCTION = re.compile("|".join(p for _, p in _RULES), re.IGNORECASE | re.MULTILINE)

#: Chars that show nothing (zero-width, joiners, soft hyphen, bidi controls, variation
#: selectors, Unicode tags): removed before matching, so ``ig\u200bnore`` is ``ignore``.
_INVISIBLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f"
    "\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\U000e0000-\U000e007f]"
)
#: Letters of other scripts that look like Latin ones (Cyrillic, Greek, Armenian, and the
#: dotless i): ``іgnоre`` with a Cyrillic і and о reads ``ignore``. NFKC already maps
#: full-width and styled (mathematical) letters.
_CONFUSABLES = str.maketrans(
    "аеорсуххіјѕԁԛԝһӏɡАВЕКМНОРСТУХІЈЅԜαεικνορτυχΑΒΕΖΗΙΚΜΝΟΡΤΥΧօսոհացı",
    "aeopcyxxijsdqwhlgABEKMHOPCTYXIJSWaeikvoptuxABEZHIKMNOPTYXouhhwgi",
)
_SEP = r"[ .\-_*|/\\~,'`]"
#: Letters spaced out to hide a word: ``i g n o r e``, ``I.G.N.O.R.E`` (4 letters at least).
_SPACED = re.compile(rf"(?<![^\W\d_])(?:[^\W\d_]{_SEP}){{3,}}[^\W\d_](?![^\W_])")
#: A cheap test for :data:`_SPACED`: it opens with a separator (most chars are not one).
_SPACED_HINT = re.compile(rf"{_SEP}[^\W\d_]{_SEP}[^\W\d_]{_SEP}[^\W\d_]")
_SEPARATORS = re.compile(r"[^\w]|_")
#: What a spaced-out run holding one of these is (its letters run together: no word breaks).
_SPACED_WORDS = (
    "ignor", "disregard", "instruct", "systemprompt", "youarenow", "jailbreak", "overrid", "approv",
)  # fmt: skip


def _unmasked(text: str) -> str:
    """``text`` in NFKC, without invisible chars, look-alike letters as the Latin ones."""
    if text.isascii():
        return text
    text = unicodedata.normalize("NFKC", text)
    return _INVISIBLE.sub("", text).translate(_CONFUSABLES)


def _spaced_runs(text: str) -> list[str]:
    """The spaced-out runs of letters in ``text``, their letters joined."""
    if not _SPACED_HINT.search(text):
        return []
    return [_SEPARATORS.sub("", m.group()) for m in _SPACED.finditer(text)]


def normalized(text: str) -> str:
    """``text`` as the instruction filter reads it: NFKC (full-width and styled letters),
    no invisible chars, look-alike letters of other scripts as the Latin ones, spaced-out
    letters joined (``i g n o r e`` -> ``ignore``)."""
    text = _unmasked(text)
    if _spaced_runs(text):
        text = _SPACED.sub(lambda m: _SEPARATORS.sub("", m.group()), text)
    return text


def _folded(text: str) -> str:
    """Normalized ``text`` as the gates read it: case-folded as the patterns' IGNORECASE
    reads it (dotless i, and İ folded to i + dot above, are i), each run of whitespace one
    space, and none before a colon (``user :`` is ``user:``)."""
    folded = text.casefold()
    if "\u0131" in folded or "\u0307" in folded:
        folded = folded.replace("\u0131", "i").replace("i\u0307", "i")
    if "  " in folded or "\n" in folded or "\t" in folded or "\r" in folded:
        folded = " ".join(folded.split())
    if " :" in folded:
        folded = folded.replace(" :", ":")
    return folded


def _gates(folded: str) -> Iterator[re.Pattern[str]]:
    """The rules whose gate holds in ``folded`` (:func:`_folded`): C substring scans, each
    gate given up at its first group that holds none of its words."""
    for gate, rule in _COMPILED:
        for group in gate:
            for word in group:
                if word in folded:
                    break
            else:
                break  # no word of this group: the gate does not hold
        else:
            yield rule


def _instruction_rule(line: str) -> bool:
    """The wording rule, on one line: a rule of :data:`_RULES` after :func:`normalized`, or
    a spaced-out run of letters that spells one of :data:`_SPACED_WORDS` (words run
    together when every letter is spaced alike)."""
    text = _unmasked(line)
    runs = _spaced_runs(text)
    if runs:
        if any(word in run.casefold() for run in runs for word in _SPACED_WORDS):
            return True
        text = _SPACED.sub(lambda m: _SEPARATORS.sub("", m.group()), text)
    return any(rule.search(text) for rule in _gates(_folded(text)))


def may_hold_instruction(text: str) -> bool:
    """False when no line of ``text`` can look like an instruction (no rule's gate holds in
    it, after :func:`normalized`); True means: test the lines."""
    folded = _folded(normalized(text))
    return any(word in folded for word in _SPACED_WORDS) or next(_gates(folded), None) is not None


def looks_like_instruction(line: str) -> bool:
    """The line addresses an assistant (an injected instruction), by its wording, read
    after :func:`normalized` (NFKC, invisible and look-alike chars, spaced-out letters).
    A list of patterns is never complete: whatever passes it is still only ever quoted,
    labelled data in a summary."""
    return _instruction_rule(line)


def strip_instructions(text: str) -> tuple[str, int]:
    """``text`` without the lines that look like injected instructions, and how many there were."""
    kept, dropped = [], 0
    for line in text.splitlines():
        if looks_like_instruction(line):
            dropped += 1
        else:
            kept.append(line)
    return "\n".join(kept), dropped
