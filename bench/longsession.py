"""Benchmark 20, long sessions (issue 32): the agent's stated facts over many compactions,
in view and answerable, and the summary against its budget; offpath beside LangChain's
``SummarizationMiddleware`` on the same sessions.

**Sessions.** Each shared SRE and coding transcript (``holmesgpt-*``, ``miniswe-*``,
``sweagent-*`` of ../shared/transcripts) with stated facts is looped: its messages (the
system prompt once) again and again, each loop after the first with its facts renamed
(:class:`Renamer`: every occurrence, in every message of the loop, of a value the agent stated
in the first loop, its letters and digits replaced by made-up ones of the same shape, file
extensions and units kept, a figure's number unlike any other figure's), so a later loop states new facts in the same sentences. A fact of
one loop found in another loop's text, or in the system prompt, is left out. A run stops at
the end of the turn in which its :data:`TARGET` th compaction showed (or when the loops run
out: :func:`loops_for` gives about four times what the target needs).

**The agent's stated facts** (:func:`stated`), chosen from the transcript, not by offpath's
extractor: in the text of the agent's own messages (fenced code blocks left out; tool calls
are not text):

* figures with a unit: a number or a range and a unit from :data:`UNITS` ("27.05 cores",
  "45-55%", "9830 Mi", "3 restarts"), and line numbers ("line 293", "lines 857-873");
* names the agent put in backticks: one token, a letter in it, 3+ chars, not a keyword
  (`minishop`, `CrashLoopBackOff`, `to_field`);
* identifiers in its prose: a token of 4+ chars with a letter and a digit, ``_``, ``/``, a
  dot inside a word or a lower-to-upper case change (``loki-0``, ``fields.py``,
  ``ForeignKey``, ``backend-service-55d749f967-z4jl2``).

A fact is found in a text when its value is there with no letter, digit or ``_`` right before
or after it (nor ``-`` / ``.`` and one: ``api`` is not in ``checkout-api``).

**Runs.** Each looped session is replayed live through LangChain's ``create_agent``
(``tests/agent_replay.py``'s scripted model and tools; :func:`bench.peakgrid.script_of`: one
``invoke`` per group of human messages), at each of :data:`THRESHOLDS`, with:

* ``offpath``: ``OffPathCompaction`` and a real worker per (threshold, summarizer) on its own
  queue; summarizers ``offline`` (the offline summarizer) and ``llm`` (the stub LLM over HTTP,
  answering after :data:`SUMMARY_S` with a summary that names nothing: the seed's template
  padded to :data:`bench.peers.SUMMARY_CHARS` chars with generic findings), each behind the
  fact guard as offpath ships it;
* ``langchain``: ``SummarizationMiddleware`` (trigger and keep at threshold / 4 and keep / 4
  tokens, chars / 4, no trimming, as benchmark 17), with benchmark 18's peer summarizers:
  ``offline`` (the facts found in its prompt, at once) and ``llm`` (the same generic summary,
  after :data:`SUMMARY_S`).

**Measured after each compaction** (a new summary in the request a model call is sent), over
the facts stated before that call:

* in view: in the request (system prompt, summary, kept messages and their tool calls);
* answerable (offpath only: the middleware keeps no archive): in view, or in one of the first
  :data:`RECALL_TOP` excerpts ``recall`` answers (:func:`offpath.agent.recall.answer`, the
  archive's full-text search) for the fact's context words: up to :data:`QUERY_WORDS` words
  nearest to it in its message (3+ chars, a letter, no stop word, none part of the fact nor
  holding it), never the fact itself (other facts of its message may be among them). Asked at
  the first model call after the compaction (its archive rows are written and its job recorded
  by then), after the first, every :data:`ANSWER_EVERY` th and the :data:`TARGET` th
  compaction, and a run's last;
* the summary's size against its budget, ``SUMMARY_MAX_SHARE`` x the threshold; where its
  chars go (by bold heading) and how many of its lines repeat another.

Targets (issue 32): after :data:`TARGET` compactions, >= 90% of the stated facts answerable
and >= 60% in view with each summarizer; no summary over its budget.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import keyword
import logging
import math
import os
import re
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    RUN_ID,
    Context,
    Result,
    create_pg_database,
    drop_pg_database,
    start_worker,
    wait,
    wait_for_log,
)

NAME = "longsession"
TITLE = "20. Long sessions (issue 32)"

THRESHOLDS = ((30_000, 10_000), (60_000, 20_000))
SUMMARIZERS = ("offline", "llm")
COMPACTORS = ("offpath", "langchain")
LABELS = {"offpath": "offpath", "langchain": "SummarizationMiddleware"}
#: The transcripts looped (file stems start so).
FAMILIES = ("holmesgpt-", "miniswe-", "sweagent-")
#: Compactions a run goes to; the curve's points.
TARGET, QUICK_TARGET = 30, 8
CURVE = (1, 5, 10, 15, 20, 25, 30)
#: The scripted model's and the summarizers' latency (s).
MODEL_DELAY_S, SUMMARY_S = 0.3, 1.0
QUICK_MODEL_DELAY_S, QUICK_SUMMARY_S = 0.2, 0.5
#: ``--quick``: these transcripts, at the first threshold, to :data:`QUICK_TARGET` compactions.
QUICK_DOCS = ("holmesgpt-backend-perf", "sweagent-pydicom-1458")
#: recall: excerpts looked at, context words asked with, how often (every n-th compaction).
RECALL_TOP = 3
QUERY_WORDS = 8
ANSWER_EVERY = int(os.environ.get("LONGSESSION_ANSWER_EVERY", "5"))
#: Targets (issue 32).
ANSWERABLE_TARGET, IN_VIEW_TARGET = 0.90, 0.60

# --- the agent's stated facts ----------------------------------------------------------

UNITS = (
    "%",
    *("ms", "µs", "us", "ns", "s", "sec", "secs", "second", "seconds", "min", "mins"),
    *("minute", "minutes", "h", "hr", "hrs", "hour", "hours", "day", "days"),
    *("m", "Mi", "Gi", "Ki", "Ti", "MiB", "GiB", "KiB", "TiB", "MB", "GB", "KB", "kB", "TB"),
    *("B", "bytes", "cores", "core", "nanocores", "millicores", "CPU", "CPUs", "vCPU"),
    *("rps", "qps", "RPS", "QPS", "req/s", "requests/s", "ops/s", "restarts", "restart"),
    *("errors", "error", "failures", "failure", "replicas", "replica", "pods", "nodes"),
    *("connections", "requests", "tests", "retries", "times", "lines", "files", "rows"),
)
_NUM = r"\d+(?:,\d{3})*(?:\.\d+)?"
_UNIT = "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))
_FIGURE = re.compile(rf"(?<![\w.,-])~?{_NUM}(?:\s?[-–]\s?{_NUM})?\s?(?:{_UNIT})(?![\w/])")
_LINE = re.compile(rf"(?<![\w])lines? {_NUM}(?:\s?[-–]\s?{_NUM})?(?![\w])")
_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
_SPAN = re.compile(r"`([^`\s]{3,})`")
_NAME = re.compile(r"[\w.\-/:]+(?:\(\))?")
_TOKEN = re.compile(r"(?<![\w./-])/?\w[\w.\-/:]*\w")
_SHAPE = re.compile(r"\d|_|/|[a-z][A-Z]|[A-Za-z]\.[A-Za-z]")
_LETTER = re.compile(r"[A-Za-z]")
NOT_FACTS = {k.lower() for k in keyword.kwlist} | {
    *("true", "false", "none", "null", "self", "e.g", "i.e", "etc", "n/a", "and/or", "todo"),
}
#: Words never asked with (a query of them finds everything alike).
STOP_WORDS = set(
    """a about above after again against all also am an and any are as at be because been
    before being below between both but by can could did do does doing down during each few
    for from further had has have having he her here hers him his how i if in into is it its
    itself just let lets like may me might more most my no nor not now of off on once only or
    other our out over own same she should so some such than that the their them then there
    these they this those through to too under until up very was we were what when where which
    while who whom why will with would you your i'll let's now next first""".split()
)


def prose(text: str) -> str:
    """The agent's own words in ``text``: fenced code blocks left out."""
    return _FENCE.sub(" ", text)


def stated(text: str) -> dict[str, str]:
    """The facts an agent's message text states (see the module doc): value -> kind
    (``figure``, ``name``, ``identifier``), in the order they first appear by kind."""
    words = prose(text)
    out: dict[str, str] = {}
    for pattern in (_FIGURE, _LINE):
        for m in pattern.finditer(words):
            out.setdefault(m.group(0).lstrip("~"), "figure")
    for m in _SPAN.finditer(words):
        value = m.group(1).strip("'\".,:;")
        if (
            _NAME.fullmatch(value)
            and len(value) >= 3
            and _LETTER.search(value)
            and value.lower() not in NOT_FACTS
        ):
            out.setdefault(value, "name")
    for m in _TOKEN.finditer(words):
        value = m.group(0)
        if len(value) >= 4 and _LETTER.search(value) and value.lower() not in NOT_FACTS:
            if _SHAPE.search(value):
                out.setdefault(value, "identifier")
    return out


_LEFT, _RIGHT = r"(?<![\w])(?<![\w][-.])", r"(?![\w])(?![-.]\w)"
_PATTERNS: dict[str, re.Pattern[str]] = {}


def finder(value: str) -> re.Pattern[str]:
    """``value`` as a fact is found in a text (see the module doc)."""
    pattern = _PATTERNS.get(value)
    if pattern is None:
        pattern = _PATTERNS[value] = re.compile(_LEFT + re.escape(value) + _RIGHT)
    return pattern


def found(value: str, text: str) -> bool:
    return value in text and finder(value).search(text) is not None


_QWORD = re.compile(r"\w[\w.:/@-]*")


def context_words(text: str, value: str) -> str:
    """The query for ``value``: up to :data:`QUERY_WORDS` words nearest to its first
    mention in ``text`` (the message's prose), nearest first, alternating before and after;
    none is part of ``value`` nor holds it. ``""`` when there are none."""
    words = prose(text)
    hit = finder(value).search(words)
    if hit is None:
        return ""
    low = value.lower()

    def usable(w: str) -> bool:
        w = w.lower()
        return (
            len(w) >= 3
            and bool(_LETTER.search(w))
            and w not in STOP_WORDS
            and w not in low
            and low not in w
        )

    before, after = [], []
    for m in _QWORD.finditer(words):
        w = m.group(0).rstrip(".:-/@")
        if not usable(w):
            continue
        if m.end() <= hit.start():
            before.append(w)
        elif m.start() >= hit.end():
            after.append(w)
    before.reverse()
    chosen: list[str] = []
    for k in range(max(len(before), len(after))):
        for side in (before, after):
            if k < len(side) and side[k] not in chosen and len(chosen) < QUERY_WORDS:
                chosen.append(side[k])
    return " ".join(chosen)


# --- loops, renamed --------------------------------------------------------------------

#: Parts of a name kept as they are when it is renamed (what kind of thing it is).
KEEP_PARTS = {"error", "exception", "warning", "test", "tests", "self", "init"}
EXTENSIONS = {
    *("py", "js", "ts", "json", "yaml", "yml", "txt", "md", "cfg", "toml", "ini", "log"),
    *("sh", "go", "rs", "java", "c", "h", "cpp", "html", "css", "sql", "xml", "csv", "rst"),
}
_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+|[^A-Za-z0-9]+")
_VOWELS, _CONSONANTS = "aeiou", "bcdfghjklmnprstvwz"


def _digest(*parts: object) -> bytes:
    return hashlib.sha256(":".join(map(str, parts)).encode()).digest()


def _word(word: str, loop: int) -> str:
    """A made-up word for ``word`` in ``loop``: vowels where it has vowels, its case."""
    h = _digest("w", loop, word.lower())
    out = []
    for i, ch in enumerate(word):
        b = h[i % len(h)] + i // len(h)
        c = _VOWELS[b % 5] if ch.lower() in _VOWELS else _CONSONANTS[b % len(_CONSONANTS)]
        out.append(c.upper() if ch.isupper() else c)
    return "".join(out)


def _digits(run: str, loop: int, least: int = 1) -> str:
    """Made-up digits for ``run`` (digits, and after a ``/`` a salt) in ``loop``: as many
    (at least ``least``), no new leading zero."""
    h = _digest("d", loop, run)
    digits = run.split("/")[0]
    n = max(len(digits), least)
    out = [str(h[i % len(h)] % 10) for i in range(n)]
    if n > 1 and (out[0] == "0") and not (len(digits) == n and digits[0] == "0"):
        out[0] = str(1 + h[0] % 9)
    return "".join(out)


class Renamer:
    """Renames, in a text of loop ``k``, every occurrence of the facts of the first loop
    (``facts``: value -> kind): a figure's digits (at least 3, unlike any other figure's,
    original or renamed), a name's or an identifier's words and digits (its file extension
    and :data:`KEEP_PARTS` kept). A name's letters and digits are mapped by a hash of (loop,
    run), so one run is renamed alike wherever it is (in a fact and in a longer one holding
    it). Loops are renamed in order (a figure's digits depend on those taken before)."""

    def __init__(self, facts: dict[str, str]) -> None:
        self.kinds = dict(facts)
        alternation = "|".join(re.escape(v) for v in sorted(facts, key=len, reverse=True))
        self.pattern = re.compile(_LEFT + f"(?:{alternation})" + _RIGHT) if facts else None
        # a figure's new digits differ from every other figure's, original or renamed
        self.figures: dict[tuple[str, int], str] = {}
        self.taken = {v for v, kind in facts.items() if kind == "figure"}

    def value(self, value: str, loop: int) -> str:
        if self.kinds.get(value) == "figure":
            known = self.figures.get((value, loop))
            if known is not None:
                return known
            for salt in itertools.count():  # a digit more every 100 tries: never stuck
                least = 3 + salt // 100
                new = re.sub(
                    r"\d+", lambda m, s=salt, n=least: _digits(f"{m.group(0)}/{s}", loop, n), value
                )
                if new not in self.taken:
                    break
            self.figures[(value, loop)] = new
            self.taken.add(new)
            return new
        ext = ""
        stem, dot, tail = value.rpartition(".")
        if dot and stem and tail in EXTENSIONS:
            value, ext = stem, dot + tail
        out = []
        for part in _PART.findall(value):
            if part.isdigit():
                out.append(_digits(part, loop))
            elif part.isalpha() and part.lower() not in KEEP_PARTS:
                out.append(_word(part, loop))
            else:
                out.append(part)
        return "".join(out) + ext

    def text(self, text: str, loop: int) -> str:
        if not loop or self.pattern is None or not text:
            return text
        return self.pattern.sub(lambda m: self.value(m.group(0), loop), text)

    def args(self, value: Any, loop: int) -> Any:
        if isinstance(value, str):
            return self.text(value, loop)
        if isinstance(value, dict):
            return {k: self.args(v, loop) for k, v in value.items()}
        if isinstance(value, list):
            return [self.args(v, loop) for v in value]
        return value


@dataclass(frozen=True)
class Fact:
    """A fact the agent stated in loop ``loop`` (see the module doc)."""

    value: str
    kind: str
    loop: int
    reply: int  # the index, in the run's replies, of the message that first states it
    query: str  # its context words


@dataclass
class Session:
    """A transcript looped ``loops`` times: the replay script and the facts, by reply."""

    name: str
    loops: int
    script: Any  # bench.peakgrid.Script
    input_loops: list[int]  # the loop of each group of human messages
    reply_loops: list[int]  # the loop of each reply
    facts: list[Fact]
    left_out: int  # facts found in another loop's text or the system prompt
    loop_chars: int  # chars of one loop

    @property
    def replies_of(self) -> list[int]:
        return [f.reply for f in self.facts]

    def loop_of_reply(self, index: int) -> int:
        return self.reply_loops[min(max(index, 0), len(self.reply_loops) - 1)]


def loop_once(messages: Sequence[Any], renamer: Renamer, k: int) -> list[Any]:
    """The messages of loop ``k`` (no system prompt): ids and tool-call ids of their own,
    facts renamed (loop 0 as it is)."""
    from langchain_core.messages import AIMessage, ToolMessage

    out = []
    for m in messages:
        if m.type == "system":
            continue
        update: dict[str, Any] = {
            "id": f"{m.id}~{k}",
            "content": renamer.text(m.content, k) if isinstance(m.content, str) else m.content,
        }
        if isinstance(m, AIMessage) and m.tool_calls:
            update["tool_calls"] = [
                {**c, "id": f"{c['id']}~{k}", "args": renamer.args(c.get("args") or {}, k)}
                for c in m.tool_calls
            ]
            update["additional_kwargs"] = {}
            update["response_metadata"] = {}
            update["invalid_tool_calls"] = []
        if isinstance(m, ToolMessage):
            update["tool_call_id"] = f"{m.tool_call_id}~{k}"
        out.append(m.model_copy(update=update, deep=True))
    return out


def session(name: str, messages: Sequence[Any], loops: int) -> Session:
    """``messages`` looped ``loops`` times (see the module doc), with the facts of each loop."""
    from langchain_core.messages import AIMessage, SystemMessage

    from bench.compacting import text_of
    from bench.peakgrid import script_of
    from offpath.compaction.accounting import total_chars

    first: dict[str, str] = {}
    for m in messages:
        if isinstance(m, AIMessage) and isinstance(m.content, str):
            for value, kind in stated(m.content).items():
                first.setdefault(value, kind)
    renamer = Renamer(first)
    system = messages[0] if isinstance(messages[0], SystemMessage) else None
    per_loop = [loop_once(messages, renamer, k) for k in range(loops)]
    looped = [*([system] if system is not None else []), *(m for ms in per_loop for m in ms)]
    script = script_of(looped, f"{name}-end")
    reply_at = {str(m.id): i for i, m in enumerate(script.replies)}
    input_loops = [int(str(group[0].id).rsplit("~", 1)[1]) for group in script.inputs]
    reply_loops: list[int] = []
    for m in script.replies:  # a closing reply the script added is in its turn's loop
        _, tilde, k = str(m.id).rpartition("~")
        reply_loops.append(int(k) if tilde else (reply_loops[-1] if reply_loops else 0))
    # the system prompt, then each loop's text: where a value is found, by position
    texts = [text_of(system) if system is not None else ""]
    texts += ["\n".join(text_of(m) for m in ms) for ms in per_loop]
    joined = "\n\n".join(texts)
    starts = [0]
    for t in texts[:-1]:
        starts.append(starts[-1] + len(t) + 2)

    def elsewhere(value: str, k: int) -> bool:
        """``value`` is found outside loop ``k``'s text (the system prompt included)."""
        lo, hi = starts[k + 1], starts[k + 1] + len(texts[k + 1])
        pattern = finder(value)
        at = joined.find(value)
        while at != -1:
            if not lo <= at < hi and pattern.match(joined, at):
                return True
            at = joined.find(value, hi if lo <= at < hi else at + 1)
        return False

    facts: list[Fact] = []
    left_out = 0
    for k, ms in enumerate(per_loop):
        seen: set[str] = set()
        for m in ms:
            if not isinstance(m, AIMessage) or not isinstance(m.content, str):
                continue
            for value, kind in stated(m.content).items():
                if value in seen:
                    continue
                seen.add(value)
                if elsewhere(value, k) or str(m.id) not in reply_at:
                    left_out += 1
                    continue
                facts.append(
                    Fact(value, kind, k, reply_at[str(m.id)], context_words(m.content, value))
                )
    facts.sort(key=lambda f: f.reply)
    chars = total_chars([m for m in messages if m.type != "system"])
    return Session(name, loops, script, input_loops, reply_loops, facts, left_out, chars)


def loops_for(messages: Sequence[Any], threshold: int, keep: int, target: int) -> int:
    """About four times the loops ``target`` compactions need: each frees about the threshold less
    the keep window and the summary budget; tool results count at most their cap."""
    from offpath.compaction.accounting import message_chars
    from offpath.config import load_settings

    s = load_settings(summarization_threshold_chars=threshold, summarization_keep_chars=keep)
    cap = s.tool_result_limit_chars
    chars = sum(
        min(message_chars(m), cap) if m.type == "tool" else message_chars(m)
        for m in messages
        if m.type != "system"
    )
    freed = max(1, threshold - keep - s.summary_budget_chars)
    return max(2, math.ceil(4 * target * freed / max(1, chars)) + 1)


def transcripts(quick: bool) -> list[tuple[str, list[Any]]]:
    """The transcripts of :data:`FAMILIES` whose agent states facts (``--quick``:
    :data:`QUICK_DOCS`)."""
    from shared import TRANSCRIPTS, load, messages_of

    out = []
    for path in TRANSCRIPTS:
        if not path.stem.startswith(FAMILIES):
            continue
        messages = messages_of(load(path))
        if any(m.type == "ai" and stated(str(m.content)) for m in messages):
            out.append((path.stem, messages))
    return [x for x in out if x[0] in QUICK_DOCS] if quick else out


# --- runs -------------------------------------------------------------------------------


@dataclass
class Point:
    """The figures after one compaction (at the first model call that holds its summary)."""

    index: int  # 1-based, in the run
    call: int  # 1-based model call
    loop: int  # the loop that call is in
    stated: int
    in_view: int
    answerable: int | None = None  # None: not asked at this point (or no archive)
    no_query: int = 0  # stated, not in view, and no context words to ask with
    summary_chars: int = 0
    summary_parts: dict[str, int] = field(default_factory=dict)  # chars by heading
    repeated: int = 0  # the summary's lines that repeat an earlier line of it
    # by loop (its number) and by kind: [stated, in view, found by recall (when asked)]
    by_loop: dict[str, list[int]] = field(default_factory=dict)
    by_kind: dict[str, list[int]] = field(default_factory=dict)
    ceiling: int = 0  # the most of ``stated`` a summary within its budget could show (budget)
    room_ceiling: int = 0  # the same in what the summary's other parts leave of its budget
    # stated, not in view, by where they were last in view (:func:`last_seen`)
    lost: dict[str, int] = field(default_factory=dict)


@dataclass
class Run:
    doc: str
    threshold: int
    keep: int
    summarizer: str
    compactor: str
    session: str
    points: list[Point] = field(default_factory=list)
    calls: int = 0
    loops_run: int = 0
    seconds: float = 0.0
    peak: int = 0
    over: int = 0  # model calls over the threshold
    error: str = ""
    jobs: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # the first reason per skip code
    maskings: int = 0
    budget: int = 0

    def at(self, index: int) -> Point | None:
        """The point after compaction ``index``, else the last one (None: no compaction)."""
        for p in self.points:
            if p.index == index:
                return p
        return self.points[-1] if self.points else None

    @property
    def summaries(self) -> list[int]:
        return [p.summary_chars for p in self.points]


def observed_model() -> Any:
    """``TranscriptModel`` that shows each call's messages to ``observer`` first."""
    from agent_replay import TranscriptModel

    class Observed(TranscriptModel):
        observer: Any = None

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):
            if self.observer is not None:
                self.observer(self.n_calls + 1, list(messages))
            return super()._generate(messages, stop, run_manager, **kw)

    return Observed


_HEADING = re.compile(r"^\*\*([^*\n]{1,60}?):?\*\*", re.M)
BEFORE_HEADINGS = "(before the first heading)"


def summary_parts(text: str) -> tuple[dict[str, int], int]:
    """Where a summary's chars go: by heading (a line opening with a bold ``**Heading**``,
    up to the next one), and how many of its non-empty lines repeat an earlier one."""
    marks = [(m.start(), m.group(1).strip()) for m in _HEADING.finditer(text)]
    parts: dict[str, int] = {}
    edges = [(0, BEFORE_HEADINGS), *marks]
    ends = [at for at, _ in marks] + [len(text)]
    for (start, name), end in zip(edges, ends, strict=True):
        if end > start:
            parts[name] = parts.get(name, 0) + end - start
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return parts, len(lines) - len(set(lines))


#: Where a fact not in view at a point was last in view at an earlier point: in the summary,
#: only in the rest of the request (the kept messages), or at none (stated and gone between two
#: points).
PLACES = ("summary", "kept", "never")


def last_seen(
    facts: Sequence[Fact], shown: set[int], summary: str, seen: dict[int, str]
) -> dict[str, int]:
    """Of ``facts`` (stated before a point), those not in view (``shown``: the ids of those in
    view) counted by where they were last in view at an earlier point (:data:`PLACES`), from
    ``seen`` (a fact's id: "summary" or "kept"), which this point's facts in view update
    (in the ``summary``'s text, else in the rest of the request). A fact dropped from a
    summary and one that left the kept part without being pinned are lost for two reasons."""
    for f in facts:
        if id(f) in shown:
            seen[id(f)] = "summary" if found(f.value, summary) else "kept"
    lost = Counter(seen.get(id(f), "never") for f in facts if id(f) not in shown)
    return {place: lost[place] for place in PLACES if lost[place]}


def budget_ceiling(facts: Sequence[Fact], outside: str, budget: int) -> int:
    """How many of ``facts`` a request could show at most with a summary of ``budget`` chars:
    those in view outside the summary (``outside``: the system prompt, the kept messages),
    and of the rest, shortest first, as many as fit the budget listed bare (each value and
    a two-char separator), as though the summary held nothing else."""
    inside = sorted(len(f.value) + 2 for f in facts if not found(f.value, outside))
    used = fit = 0
    for chars in inside:
        if used + chars > budget:
            break
        used += chars
        fit += 1
    return len(facts) - len(inside) + fit


class Tracker:
    """Watches a run's model calls: at each new summary, the facts in view; at the next call
    (when the compaction's archive rows and job record are in), those answerable, at every
    :data:`ANSWER_EVERY` th compaction (and the run's last, in :meth:`finish`)."""

    def __init__(self, run: Run, doc: Session, engine: Any, threshold: int, target: int) -> None:
        self.run = run
        self.target = target
        self.doc = doc
        self.engine = engine  # None: no archive (SummarizationMiddleware)
        self.threshold = threshold
        self.replies = doc.replies_of
        self.last: tuple[str, int] | None = None
        self.hidden: list[Fact] = []  # of the last point: stated, not in view
        self.due = False  # the last point is to be asked at the next call
        self.seen: dict[int, str] = {}  # fact id -> where it was last in view (last_seen)

    def __call__(self, call: int, messages: list[Any]) -> None:
        from bench.compacting import is_summary_message, text_of
        from offpath.compaction.accounting import message_chars, total_chars

        size = total_chars(messages)
        self.run.peak = max(self.run.peak, size)
        self.run.over += size > self.threshold
        self.run.calls = call
        if self.due:
            self.answer()
        summary = next((m for m in messages if is_summary_message(m)), None)
        if summary is None:
            return
        key = (str(summary.id), hash(str(summary.content)))
        if key == self.last:
            return
        self.last = key
        if where := os.environ.get("LONGSESSION_DUMP"):  # a directory: each summary, to read
            path = Path(where) / f"{self.run.session}-{len(self.run.points) + 1:02d}.txt"
            path.write_text(str(summary.content))
        view = "\n".join(text_of(m) for m in messages)
        facts = self.doc.facts[: bisect.bisect_right(self.replies, call - 2)]
        shown = {id(f) for f in facts if found(f.value, view)}
        point = Point(
            len(self.run.points) + 1,
            call,
            self.doc.loop_of_reply(call - 1),
            len(facts),
            len(shown),
            summary_chars=message_chars(summary),
        )
        point.summary_parts, point.repeated = summary_parts(str(summary.content))
        point.lost = last_seen(facts, shown, text_of(summary), self.seen)
        if self.run.budget:
            outside = "\n".join(text_of(m) for m in messages if m is not summary)
            point.ceiling = budget_ceiling(facts, outside, self.run.budget)
            others = sum(
                n
                for k, n in point.summary_parts.items()
                if k not in ("Pinned facts", "Key findings")
            )
            point.room_ceiling = budget_ceiling(facts, outside, max(0, self.run.budget - others))
        for f in facts:
            for table, key2 in ((point.by_loop, str(f.loop)), (point.by_kind, f.kind)):
                row = table.setdefault(key2, [0, 0, 0])
                row[0] += 1
                row[1] += id(f) in shown
        self.run.points.append(point)
        self.hidden = [f for f in facts if id(f) not in shown]
        if where := os.environ.get("LONGSESSION_DUMP"):  # the facts stated, not in view
            path = Path(where) / f"{self.run.session}-{point.index:02d}-hidden.txt"
            path.write_text("".join(f"{f.loop}\t{f.kind}\t{f.value}\n" for f in self.hidden))
        self.due = self.engine is not None and (
            point.index in (1, self.target) or point.index % ANSWER_EVERY == 0
        )

    def answer(self) -> None:
        """Ask ``recall`` for each fact of the last point that was not in view."""
        from bench.compacting import recall_hits
        from offpath.agent import recall

        self.due = False
        point = self.run.points[-1]
        got = 0
        missed: list[str] = []
        where = ""
        for f in self.hidden:
            if not f.query:
                point.no_query += 1
                continue
            hits = recall_hits(recall.answer(self.engine, self.run.session, f.query))
            if any(found(f.value, h) for h in hits[:RECALL_TOP]):
                got += 1
                point.by_loop[str(f.loop)][2] += 1
                point.by_kind[f.kind][2] += 1
            elif where := os.environ.get("LONGSESSION_DUMP"):
                missed.append(f"{f.value!r} (loop {f.loop}), asked {f.query!r}:")
                missed += [f"  {h[:300]!r}" for h in hits[:RECALL_TOP]] or ["  (no hits)"]
        point.answerable = point.in_view + got
        if missed and where:
            path = Path(where) / f"{self.run.session}-{point.index:02d}-not-found.txt"
            path.write_text("\n".join(missed) + "\n")

    def finish(self) -> None:
        """At the run's end: ask for its last point if it was not asked."""
        if self.engine is not None and self.run.points and self.run.points[-1].answerable is None:
            self.answer()


class Bench:
    """What the runs of one threshold share: the agents' checkpointers (offpath's runs on a
    pool of their own), offpath's clients per summarizer, the measuring engine, the delays."""

    def __init__(
        self,
        threshold: int,
        keep: int,
        saver: Any,
        offpath_saver: Any,
        agent_url: str,
        clients: dict[str, Any],
        engine: Any,
        quick: bool,
    ) -> None:
        self.threshold, self.keep = threshold, keep
        self.saver, self.offpath_saver, self.agent_url = saver, offpath_saver, agent_url
        self.clients = clients
        self.engine = engine
        self.model_delay_s = QUICK_MODEL_DELAY_S if quick else MODEL_DELAY_S
        self.summary_s = QUICK_SUMMARY_S if quick else SUMMARY_S
        self.target = QUICK_TARGET if quick else TARGET
        self.trackers: dict[str, Tracker] = {}  # by session

    def middleware(self, compactor: str, summarizer: str) -> list[Any]:
        from langchain.agents.middleware import SummarizationMiddleware

        from bench.peak import chars_per_token
        from bench.peers import stub_summarizer
        from offpath import OffPathCompaction

        if compactor == "offpath":
            client = self.clients[summarizer]
            return [
                OffPathCompaction(client.settings, checkpointer_url=self.agent_url, client=client)
            ]
        return [
            SummarizationMiddleware(
                stub_summarizer(summarizer, self.summary_s),
                trigger=("tokens", self.threshold // 4),
                keep=("tokens", self.keep // 4),
                token_counter=chars_per_token,
                trim_tokens_to_summarize=None,
            )
        ]

    def replay(self, doc: Session, summarizer: str, compactor: str) -> Run:
        from langchain.agents import create_agent

        tag = f"{self.threshold // 1000}k-{summarizer}-{compactor}"
        run = Run(
            doc.name,
            self.threshold,
            self.keep,
            summarizer,
            compactor,
            f"ls-{doc.name[:24]}-{tag}-{RUN_ID}",
        )
        if compactor == "offpath":
            run.budget = self.clients[summarizer].settings.summary_budget_chars
        # each run its own message objects: the runs go at once
        script = doc.script
        replies = [m.model_copy(deep=True) for m in script.replies]
        engine = self.engine if compactor == "offpath" else None
        tracker = Tracker(run, doc, engine, self.threshold, self.target)
        self.trackers[run.session] = tracker
        model = observed_model()(
            replies=replies, delay_s=self.model_delay_s, record=False, observer=tracker
        )
        agent = create_agent(
            model,
            script.tools,
            system_prompt=script.system,
            middleware=self.middleware(compactor, summarizer),
            checkpointer=self.offpath_saver if compactor == "offpath" else self.saver,
        )
        config = {"configurable": {"thread_id": run.session}, "recursion_limit": 100_000}
        started = time.perf_counter()
        try:
            for humans, loop in zip(script.inputs, doc.input_loops, strict=True):
                if len(run.points) >= self.target:
                    break
                run.loops_run = loop + 1
                agent.invoke({"messages": [m.model_copy(deep=True) for m in humans]}, config)
        except Exception as exc:  # reported, the other runs go on
            run.error = f"{type(exc).__name__}: {exc}"[:300]
        run.seconds = time.perf_counter() - started
        return run


def run(ctx: Context) -> Result:
    from bench.peak import LogLines, job_counts
    from bench.peers import SUMMARY_CHARS
    from offpath.config import EnvironmentSettings, get_settings
    from offpath.coordination.runtime import Client
    from offpath.stores.checkpoints import open_checkpoints_url
    from offpath.stores.db.engine import make_engine, migrate

    assert ctx.stub is not None
    base = get_settings()
    migrate(base)
    quick = ctx.quick
    target = QUICK_TARGET if quick else TARGET
    thresholds = THRESHOLDS[:1] if quick else THRESHOLDS
    if only_t := os.environ.get("LONGSESSION_THRESHOLDS"):  # e.g. "30000": a subset, to look into
        thresholds = tuple(t for t in thresholds if str(t[0]) in only_t.split(","))
    compactors = tuple(
        c for c in COMPACTORS if c in os.environ.get("LONGSESSION_COMPACTORS", c).split(",")
    )
    if only := os.environ.get("LONGSESSION_DOCS"):  # a subset, to look into one
        chosen = [d for d in transcripts(False) if d[0] in only.split(",")]
    else:
        chosen = transcripts(quick)
    summary_s = QUICK_SUMMARY_S if quick else SUMMARY_S
    ctx.stub.set_delay(summary_s)
    ctx.stub.control(delay_s=summary_s, summary_chars=SUMMARY_CHARS, names_nothing=True)
    agent_url = create_pg_database("offpath_bench_longsession")
    lines = LogLines()
    mw_log = logging.getLogger("offpath.middleware")
    mw_log.addHandler(lines)
    old_level = mw_log.level
    mw_log.setLevel(logging.INFO)
    shared_client = Client.open(base)
    engine = make_engine(base)  # recall's reads, beside the runs' own connections
    runs: list[Run] = []
    docs: dict[tuple[str, int], Session] = {}
    phases: list[tuple[int, int, float]] = []
    load_before = os.getloadavg()
    try:
        for threshold, keep in thresholds:
            workers: list[subprocess.Popen[bytes]] = []
            clients: dict[str, Any] = {}
            try:
                logs = []
                for s in SUMMARIZERS:
                    queue = f"{base.celery_queue}-ls{threshold // 1000}-{s}"
                    env = {
                        **os.environ,
                        "LOG_LEVEL": "INFO",
                        "CELERY_QUEUE": queue,
                        "SUMMARIZATION_THRESHOLD_CHARS": str(threshold),
                        "SUMMARIZATION_KEEP_CHARS": str(keep),
                        "WORKER_CONCURRENCY": "8",
                    }
                    if s == "offline":
                        env.pop("OPENAI_BASE_URL", None)
                        env.pop("OPENAI_API_KEY", None)
                    log_path = (
                        Path(tempfile.gettempdir()) / f"bench-longsession-{RUN_ID}-{queue}.log"
                    )
                    with open(log_path, "ab") as out:
                        workers.append(start_worker(env, f"{queue}@%h", out, loglevel="info"))
                    logs.append(log_path)
                    settings = EnvironmentSettings(
                        summarization_threshold_chars=threshold,
                        summarization_keep_chars=keep,
                        celery_queue=queue,
                    )
                    clients[s] = Client(settings, shared_client.engine, shared_client.leases)
                for proc, log_path in zip(workers, logs, strict=True):
                    wait_for_log(log_path, "ready.", proc, 600)
                sessions = []
                for name, messages in chosen:
                    doc = session(name, messages, loops_for(messages, threshold, keep, target))
                    docs[(name, threshold)] = doc
                    sessions.append(doc)
                cells = [(d, s, c) for d in sessions for s in SUMMARIZERS for c in compactors]
                ours = sum(c == "offpath" for _, _, c in cells)
                with (
                    open_checkpoints_url(agent_url, base, pool_size=len(cells) - ours) as theirs,
                    open_checkpoints_url(agent_url, base, pool_size=ours) as offpaths,
                ):
                    bench = Bench(
                        threshold,
                        keep,
                        theirs.saver,
                        offpaths.saver,
                        agent_url,
                        clients,
                        engine,
                        quick,
                    )
                    started = time.perf_counter()
                    with ThreadPoolExecutor(len(cells), thread_name_prefix="longsession") as pool:
                        futures = [pool.submit(bench.replay, *cell) for cell in cells]
                        phase = [f.result() for f in futures]
                    phases.append((threshold, len(cells), time.perf_counter() - started))
                for tracker in bench.trackers.values():
                    tracker.finish()  # a run's last point, if it was not asked
                offpath_runs = [r for r in phase if r.compactor == "offpath"]

                def settled(offpath_runs: list[Run] = offpath_runs) -> bool:
                    for r in offpath_runs:
                        jobs, r.maskings, _, r.reasons = job_counts(shared_client.engine, r.session)
                        r.jobs = dict(jobs)
                    return all(
                        not (r.jobs.get("queued") or r.jobs.get("running")) for r in offpath_runs
                    )

                try:
                    wait(settled, 60, interval=1.0)
                except RuntimeError:
                    pass  # reported as they are
                runs += phase
                print(
                    f"bench: {NAME}: {threshold:,} / {keep:,}: {len(cells)} runs in "
                    f"{phases[-1][2]:.0f} s",
                    flush=True,
                )
            finally:
                for proc in workers:
                    proc.terminate()
                for proc in workers:
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(timeout=10)
    finally:
        load_after = os.getloadavg()
        mw_log.removeHandler(lines)
        mw_log.setLevel(old_level)
        engine.dispose()
        shared_client.close()
        drop_pg_database(agent_url)
        ctx.stub.control(summary_chars=0, names_nothing=False)
        ctx.stub.set_delay(0.0)
    print(f"bench: {NAME}: worker logs {tempfile.gettempdir()}/bench-longsession-{RUN_ID}-*.log")
    dump(runs)
    return report(runs, docs, phases, quick, (load_before, load_after), lines.lines)


def dump(runs: list[Run]) -> None:
    """Every run's points as JSON in the temp directory, to look into a row afterwards."""
    import dataclasses

    path = Path(tempfile.gettempdir()) / f"bench-longsession-{RUN_ID}.json"
    path.write_text(json.dumps([dataclasses.asdict(r) for r in runs]))
    print(f"bench: {NAME}: the runs' points are in {path}", flush=True)


# --- report ------------------------------------------------------------------------------


def _pct(part: int | None, whole: int) -> str:
    return "-" if part is None or not whole else f"{part / whole:.0%}"


@dataclass
class Sum:
    runs: int = 0
    stated: int = 0
    in_view: int = 0
    asked: int = 0  # stated, at points where recall was asked
    answerable: int = 0
    ceiling: int = 0
    room_ceiling: int = 0

    def add(self, p: Point) -> None:
        self.runs += 1
        self.stated += p.stated
        self.in_view += p.in_view
        self.ceiling += p.ceiling
        self.room_ceiling += p.room_ceiling
        if p.answerable is not None:
            self.asked += p.stated
            self.answerable += p.answerable

    @property
    def view_share(self) -> float:
        return self.in_view / self.stated if self.stated else 0.0

    @property
    def answer_share(self) -> float | None:
        return self.answerable / self.asked if self.asked else None


def report(
    runs: list[Run],
    docs: dict[tuple[str, int], Session],
    phases: list[tuple[int, int, float]],
    quick: bool,
    load: tuple[tuple[float, ...], tuple[float, ...]],
    mw_lines: list[str],
) -> Result:
    target = QUICK_TARGET if quick else TARGET
    curve = [i for i in CURVE if i < target] + [target]
    groups = sorted(
        {(r.threshold, r.keep, r.summarizer, r.compactor) for r in runs},
        key=lambda g: (g[0], COMPACTORS.index(g[3]), SUMMARIZERS.index(g[2])),
    )

    def of(g: tuple[int, int, str, str]) -> list[Run]:
        return [r for r in runs if (r.threshold, r.keep, r.summarizer, r.compactor) == g]

    head = " | ".join(f"after {i}" for i in curve)
    table = [
        "**The curve**: the agent's stated facts in view (answerable: in view or in recall's "
        f"first {RECALL_TOP} excerpts), over the runs that reached each compaction",
        "",
        f"| threshold / keep | compactor | summarizer | {head} |",
        "|---|---|---|" + "---|" * len(curve),
    ]
    finals: dict[tuple[int, int, str, str], Sum] = {}
    for g in groups:
        cells = []
        for i in curve:
            total = Sum()
            for r in of(g):
                p = next((p for p in r.points if p.index == i), None)
                if p is not None:
                    total.add(p)
            if not total.runs:
                cells.append("-")
                continue
            cell = f"{total.view_share:.0%}"
            if total.answer_share is not None:
                cell += f" ({total.answer_share:.0%})"
            if total.runs < len(of(g)):
                cell += f" [{total.runs} runs]"
            cells.append(cell)
        final = Sum()
        for r in of(g):
            if (p := r.at(target)) is not None:
                final.add(p)
        finals[g] = final
        table.append(
            f"| {g[0]:,} / {g[1]:,} | {LABELS[g[3]]} | {g[2]} | " + " | ".join(cells) + " |"
        )
    table += [
        "",
        f"**Each run** after its {target}th compaction (or its last, when it had fewer)",
        "",
        "| transcript | threshold | compactor | summarizer | loops | model calls | compactions "
        "| facts stated | in view | answerable | no context words | summary chars (max / budget, "
        "over) | peak / threshold (calls over) | maskings | in view by loop |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    short: list[str] = []
    errors: list[str] = []
    for g in groups:
        for r in sorted(of(g), key=lambda r: r.doc):
            p = r.at(target)
            if r.error:
                errors.append(
                    f"{r.doc} {r.threshold // 1000}k {r.summarizer} {r.compactor}: {r.error}"
                )
            if len(r.points) < target:
                short.append(
                    f"{r.doc} {r.threshold // 1000}k {r.summarizer} {LABELS[r.compactor]} "
                    f"({len(r.points)})"
                )
            if p is None:
                table.append(
                    f"| {r.doc} | {r.threshold:,} | {LABELS[r.compactor]} | {r.summarizer} | "
                    f"{r.loops_run} | {r.calls} | 0 | - | - | - | - | - | "
                    f"{r.peak / r.threshold:.2f} ({r.over}) | {r.maskings} | - |"
                )
                continue
            sizes = r.summaries
            over = sum(c > r.budget for c in sizes) if r.budget else 0
            size_cell = (
                f"{max(sizes):,} / {r.budget:,}, {over}" if r.budget else f"{max(sizes):,} / -"
            )
            by_loop = " ".join(
                f"{row[1] / row[0]:.0%}" if row[0] else "-"
                for _, row in sorted(p.by_loop.items(), key=lambda kv: int(kv[0]))
            )
            table.append(
                f"| {r.doc} | {r.threshold:,} | {LABELS[r.compactor]} | {r.summarizer} | "
                f"{r.loops_run} | {r.calls} | {len(r.points)} | {p.stated} | "
                f"{_pct(p.in_view, p.stated)} | {_pct(p.answerable, p.stated)} | "
                f"{p.no_query if p.answerable is not None else '-'} | {size_cell} | "
                f"{r.peak / r.threshold:.2f} ({r.over}) | {r.maskings} | {by_loop} |"
            )
    # by kind, offpath, at the target
    kinds = ("figure", "name", "identifier")
    table += [
        "",
        f"**By kind** (offpath, after its {target}th compaction): in view (answerable)",
        "",
        "| threshold | summarizer | " + " | ".join(kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
    ]
    for g in groups:
        if g[3] != "offpath":
            continue
        rows = {k: [0, 0, 0] for k in kinds}
        asked = {k: 0 for k in kinds}
        for r in of(g):
            p = r.at(target)
            if p is None:
                continue
            for k, row in p.by_kind.items():
                for j in range(3):
                    rows[k][j] += row[j]
                if p.answerable is not None:
                    asked[k] += row[0]
        cells = [
            f"{rows[k][1] / rows[k][0]:.0%} ({(rows[k][1] + rows[k][2]) / rows[k][0]:.0%})"
            if rows[k][0]
            else "-"
            for k in kinds
        ]
        table.append(f"| {g[0]:,} | {g[2]} | " + " | ".join(cells) + " |")
    # where the chars of offpath's summaries go
    configs = [g for g in groups if g[3] == "offpath"]
    points = {g: [p for r in of(g) for p in r.points] for g in configs}
    headings: list[str] = []
    for g in configs:
        for p in points[g]:
            headings += [n for n in p.summary_parts if n not in headings]
    table += [
        "",
        "**Where offpath's summaries' chars go** (mean chars per summary, by heading)",
        "",
        "| part | " + " | ".join(f"{g[0] // 1000}k {g[2]}" for g in configs) + " |",
        "|---|" + "---|" * len(configs),
    ]
    for n in headings:
        cells = [
            f"{sum(p.summary_parts.get(n, 0) for p in points[g]) / max(1, len(points[g])):,.0f}"
            for g in configs
        ]
        table.append(f"| {n} | " + " | ".join(cells) + " |")
    table.append(
        "| **whole summary** (over budget) | "
        + " | ".join(
            f"{sum(p.summary_chars for p in points[g]) / max(1, len(points[g])):,.0f} "
            f"({sum(p.summary_chars > r.budget for r in of(g) for p in r.points)} of "
            f"{len(points[g])})"
            for g in configs
        )
        + " |"
    )
    table.append(
        "| summaries with a repeated line | "
        + " | ".join(
            f"{sum(p.repeated > 0 for p in points[g])} of {len(points[g])}" for g in configs
        )
        + " |"
    )
    # the targets
    summaries = [(c, r.budget) for r in runs if r.compactor == "offpath" for c in r.summaries]
    over_budget = [c for c, b in summaries if c > b]
    checks: dict[str, bool] = {}
    measured = []
    for g, final in finals.items():
        name = f"{g[0] // 1000}k {g[2]}"
        if g[3] == "offpath":
            share = final.answer_share or 0.0
            checks[f"{name} answerable"] = share >= ANSWERABLE_TARGET
            checks[f"{name} in view"] = final.view_share >= IN_VIEW_TARGET
            ceiling = final.ceiling / final.stated if final.stated else 0.0
            room = final.room_ceiling / final.stated if final.stated else 0.0
            measured.append(
                f"{name} {final.view_share:.0%} in view (ceiling {ceiling:.0%}, in the room "
                f"the other parts leave {room:.0%}), {share:.0%} answerable"
            )
    lc = [
        f"{g[0] // 1000}k {g[2]} {f.view_share:.0%}"
        for g, f in finals.items()
        if g[3] == "langchain"
    ]
    checks["summaries within budget"] = not over_budget
    checks[f"every run reached {target} compactions"] = not short
    checks["no run failed"] = not errors
    largest = max(summaries, default=(0, 0))
    text = (
        f"offpath after {target} compactions: "
        + "; ".join(measured)
        + f"; SummarizationMiddleware in view: {', '.join(lc)}; offpath summaries over budget: "
        + f"{len(over_budget)} of {len(summaries)} (largest {largest[0]:,} chars, budget "
        + f"{largest[1]:,})"
        + (" (--quick: a subset)" if quick else "")
    )
    names = sorted({d.name for d in docs.values()})
    details = [
        "sessions: "
        + "; ".join(
            f"{d.name} at {t // 1000}k: up to {d.loops} loops of {d.loop_chars:,} chars, "
            f"{len(d.facts)} facts ({d.left_out} left out: also in another loop or the system prompt)"
            for (_, t), d in sorted(docs.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        ),
        "what ran: "
        + (
            f"(--quick) {', '.join(names)} at {THRESHOLDS[0][0]:,} / {THRESHOLDS[0][1]:,}"
            if quick
            else f"{', '.join(names)} at " + ", ".join(f"{t:,} / {k:,}" for t, k in THRESHOLDS)
        )
        + f"; offpath (a real worker per threshold and summarizer) and SummarizationMiddleware, "
        f"each with the offline and the LLM-shaped summarizer, all runs of a threshold at once "
        f"({', '.join(f'{n} runs at {t // 1000}k in {s:.0f} s' for t, n, s in phases)}); model "
        f"{QUICK_MODEL_DELAY_S if quick else MODEL_DELAY_S:g} s per call, LLM-shaped summaries "
        f"{QUICK_SUMMARY_S if quick else SUMMARY_S:g} s; a run stops at the end of the turn of "
        f"its {target}th compaction",
        "facts: what the agent stated in its own messages' text (figures with units, line "
        "numbers, names in backticks, identifiers in its prose; not offpath's extractor), each "
        "loop after the first renamed; a fact counts from the model call after the message "
        "that states it",
        f"in view: in the request of the first model call holding the compaction's summary "
        f"(system prompt, summary, kept messages and tool calls); answerable: in view, or in "
        f"one of recall's first {RECALL_TOP} excerpts (offpath.agent.recall.answer) for up to "
        f"{QUERY_WORDS} context words nearest the fact in its message (never the fact), asked "
        f"at the next model call after compactions 1, every {ANSWER_EVERY}th, the {target}th and "
        "a run's last (other facts of the message may be among the context words); "
        "SummarizationMiddleware keeps no archive (in view only)",
        f"budget: SUMMARY_MAX_SHARE x the threshold ({', '.join(f'{t * 0.15:,.0f}' for t, _ in THRESHOLDS)} "
        "chars at the default 0.15), against the summary message's chars; ceiling: the most "
        "of the stated facts a request could show with a summary within its budget (those in "
        "view outside the summary, and of the rest, shortest first, as many as fit the budget "
        "listed bare, each value and two chars, as though the summary held nothing else); in "
        "the room the other parts leave: the same in the budget less the summary's parts but "
        "Pinned facts and Key findings (the agent's place, Decisions, Done, the sections added "
        "at the apply, the archive index, the recall line)",
        "ceiling by run after its last compaction (in the room the other parts leave): "
        + "; ".join(
            f"{r.doc} {r.threshold // 1000}k {r.summarizer} "
            f"{r.points[-1].ceiling / max(1, r.points[-1].stated):.0%} "
            f"({r.points[-1].room_ceiling / max(1, r.points[-1].stated):.0%})"
            for r in runs
            if r.compactor == "offpath" and r.points
        ),
        f"stated facts not in view after the {target}th compaction, by where they were last in "
        "view at an earlier compaction (in the summary: dropped from it; only in the kept "
        "messages: never pinned when they went; at none): "
        + "; ".join(
            f"{g[0] // 1000}k {g[2]} {LABELS[g[3]]} "
            + " / ".join(
                str(sum(p.lost.get(place, 0) for r in of(g) if (p := r.at(target)) is not None))
                for place in PLACES
            )
            for g in groups
        ),
        f"machine load: 1/5/15-min load average {'/'.join(f'{x:.1f}' for x in load[0])} before, "
        f"{'/'.join(f'{x:.1f}' for x in load[1])} after, on {os.cpu_count()} cores",
        "offpath jobs (all runs): "
        + str(
            dict(
                sorted(
                    sum(
                        (Counter(r.jobs) for r in runs if r.compactor == "offpath"), Counter()
                    ).items()
                )
            )
        )
        + f"; middleware log: {len(mw_lines)} lines, "
        f"{sum(' WARNING ' in x or x.startswith('WARNING') for x in mw_lines)} warnings",
        "targets: " + ", ".join(f"{k} {'met' if v else 'missed'}" for k, v in checks.items()),
    ]
    crossed = [
        f"{r.doc} {r.threshold // 1000}k {r.summarizer}: {r.over} of {r.calls} calls; "
        + "; ".join(
            f"{code} {r.jobs.get(f'skipped ({code})', 0)}x, first: {why}"
            for code, why in r.reasons.items()
        )
        for r in runs
        if r.compactor == "offpath" and r.over > 0.05 * max(r.calls, 1)
    ]
    if crossed:
        details.append(
            "offpath runs over the threshold on more than 5% of model calls (benchmark 17's "
            "target): " + " | ".join(crossed)
        )
    if short:
        details.append(
            f"runs short of {target} compactions (figures at their last): " + "; ".join(short)
        )
    if errors:
        details.append("errors: " + "; ".join(errors)[:2000])
    return Result(
        TITLE,
        f"after {target if not quick else TARGET} compactions, >= {ANSWERABLE_TARGET:.0%} of the "
        f"agent's stated facts answerable and >= {IN_VIEW_TARGET:.0%} in view, with each "
        "summarizer; 0 summaries over budget",
        text,
        all(checks.values()),
        details,
        "; ".join(k for k, v in checks.items() if not v),
        table=table,
    )
