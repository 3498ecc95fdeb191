"""The injected-instruction filter: lines that speak to an assistant rather than record a
finding (:func:`looks_like_instruction`, :func:`strip_instructions`), read after
:func:`normalized` undoes the masks (NFKC, invisible and look-alike chars, spaced-out letters),
with cheap gates so most text is passed over by substring scans.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

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
