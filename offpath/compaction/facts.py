"""The fact guard: the specifics of the removed messages that a summary must not lose (issues
11 and 19).

Pure functions, no I/O. :func:`extract` finds the facts of a list of messages with
regular expressions: identifiers (pod, host and service names, ticket and trace ids,
commit SHAs, file paths, URLs, versions, environment variable names, function names),
error and exit codes (in any letter case), configuration values and counts, numbers with
units (CPU millicores too), and timestamps. Identifiers of any domain (an order id
``#W2378156``, a user id ``chen_johnson_4204``, a ten-digit item id) are recognised by their
shape, and bare numbers count only by their use: passed as a tool argument, asked for by
the user, or recurring (issue 19: the guard knew only SRE shapes). :func:`rank` orders them
by what an investigator needs: stated by the agent (its text, its tool calls' arguments)
or asked by the user, then seen in several messages, then seen once; a fact carried from an
earlier summary stays ahead of new ones (no telephone game). Facts seen only on noise lines
(healthy rows of a table, directory listings, ``kubectl describe`` boilerplate) are not
pinned unless used elsewhere.
:func:`pin` appends the facts a summary missed as a bounded **Pinned facts**
section; each entry is the line the fact was found on, clipped, with the id of
the message it came from, so the ``recall`` tool can fetch the original from the
archive.

It runs after any summarizer (the LLM's or the offline one): see
:class:`offpath.compaction.summarizers.guarded.GuardedSummarizer`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage

from offpath.compaction.summary import (
    cite,
    is_summary,
    looks_like_instruction,
    may_hold_instruction,
    summary_body,
)

#: The heading of the section the guard appends (after the seed's four).
PINNED_HEADING = "**Pinned facts**"
#: The heading of the section a compaction applied late adds for the messages that came
#: after its summary was written and that it removes too (LLM-free: their facts, by message;
#: issue 18). Its entries read like pinned ones.
SINCE_HEADING = "**Since this summary was written**"
#: The heading of the entries the check before the swap adds: identifiers that messages
#: written while the summary was prepared name, which only the removed part held (issue 19).
SWAP_HEADING = "**Named since this summary was written**"
#: Most chars of one pinned entry's quoted line.
MAX_LINE_CHARS = 160
#: Facts listed by value (after the quoted lines) need at least this score: stated by the
#: agent, or recurring; a request id seen once in a log dump is left to ``recall``.
LISTED_MIN_SCORE = 5

# Kinds, most specific first: a span taken by one kind is not matched again by a later one.
# A kind may have several patterns (tried in turn). Each pattern opens with the char class
# of its first char and checks the char before it by a look-behind *after* that char
# (``\d(?<!\w\d)`` rather than ``\b\d``): the regex engine then skips, in C, every position
# whose char cannot start a fact (issue 13: the guard's scan was most of a job's CPU).
_UNITS = (
    r"(?:ms|µs|us|ns|s|sec|secs|seconds?|min|mins|minutes?|h|hrs?|hours?|days?|%|[KMGT]i?B?|"
    r"[KMGT]iB|bytes?|cores?|nanocores|millicores|m?cpus?|m|req/s|rps|qps|ops/s|conns?|connections)"
)
_KINDS: tuple[tuple[str, re.Pattern[str], int], ...] = (
    ("url", re.compile(r"https?://[^\s'\"<>()\[\]{}`]+[^\s'\"<>()\[\]{}`.,;:!?]"), 3),
    (
        "timestamp",
        re.compile(
            r"\d(?<!\w\d)(?:\d{3}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?(?:\.\d+)?"
            r"(?:Z|[+-]\d{2}:?\d{2})?)?"
            r"|\d?:\d{2}:\d{2}(?:\.\d+)?Z?\b|\d?:\d{2}Z?(?= ?(?:UTC|GMT|Z)\b))"
        ),
        2,
    ),
    (
        "path",  # absolute or relative to ~, . or ..: two segments at least
        re.compile(
            r"(?:~/(?<![\w/.~-]~/)|\.\./(?<![\w/.~-]\.\./)|\./(?<![\w/.~-]\./)|/(?<![\w/.~-]/))"
            r"[\w.@+-]++(?:/[\w.@+-]++)+/?"
        ),
        3,
    ),
    ("path", re.compile(r"\w(?<!\w\w)[\w.-]*+(?:/[\w.@+-]+)+\.[A-Za-z]\w{0,5}\b"), 3),  # a/b.py
    ("ticket", re.compile(r"[A-Z](?<![\w.-][A-Z])[A-Z0-9]{1,9}-\d{1,7}(?![\w.-])"), 3),
    (
        "trace_id",
        re.compile(
            r"[TtSsRrCc](?<!\w[TtSsRrCc])(?i:(?<=t)race|(?<=s)pan|(?<=r)equest|(?<=c)orrelation)"
            r"[_-]?(?i:id)[=: ]+([\w-]{6,})"
        ),
        3,
    ),
    (
        "sha",  # 7-40 hex chars with a letter and a digit among them
        re.compile(
            r"[0-9a-f](?<![\w.-][0-9a-f])(?=[0-9a-f]{6})(?:(?<=[a-f])|(?=[0-9a-f]{0,38}[a-f]))"
            r"(?:(?<=\d)|(?=[0-9a-f]{0,38}\d))[0-9a-f]{6,39}(?![\w.-])"
        ),
        3,
    ),
    (
        "error_code",
        re.compile(
            r"[sce45A-Z](?<!\w.)(?:(?<=H)TTP[=: ]+\d{3}\b|(?<=s)tatus[=: ]+\d{3}\b"
            r"|(?<=c)ode[=: ]+\d{3}\b|(?<=e)xit (?:code|status)[=: ]+\d{3}\b"
            r"|(?<=[45])\d\ds?(?= (?:errors?|responses?|status|Bad|Service|Gateway|Internal|"
            r"Not Found|Forbidden|Unauthorized|Too Many)\b)"
            r"|(?<=[A-Z])[A-Za-z]*+(?:(?<=[A-Za-z]Error)|(?<=[A-Za-z]Exception)"
            r"|(?<=[A-Za-z]BackOff)|(?<=[A-Za-z]Killed)|(?<=[A-Za-z]Failure)"
            r"|(?<=[A-Za-z]Timeout))\b"
            r"|(?<=E)(?:CONNREFUSED|CONNRESET|CONNABORTED|TIMEDOUT|HOSTUNREACH|NETUNREACH|"
            r"ADDRINUSE|ACCES|PERM|PIPE|AGAIN|NOENT|NOSPC|MFILE|NOTFOUND|NOMEM|AI_AGAIN)\b"
            r"|(?:(?<=E)(?:RR)?|(?<=O)RA|(?<=S)QLSTATE)[-_ ]?\d{3,5}\b)"
        ),
        3,
    ),
    (
        "error_code",  # exit and status codes, in any letter case ("Exit Code:    137")
        re.compile(
            r"(?i:[ers](?<![\w.-][ers])(?:(?<=e)xit|(?<=r)eturn|(?<=s)tatus)[ _-]?"
            r"(?:code|status)\s*[=:]?\s*\d{1,3})(?!\d)"
        ),
        3,
    ),
    (
        "config",  # a setting and its value: "Restart Count:  6", "memory:  512Mi", "DB_TIMEOUT=5s"
        re.compile(
            r"(?m)^[ \t]*([A-Za-z][\w.-]*(?: [A-Za-z][\w.-]*){0,3}:[ \t]+\d[\w.%/]*)[ \t]*$"
            r"|([A-Za-z](?<![\w.-][A-Za-z])[\w.-]*=\d[\w.%]*)(?![\w.])",
            re.IGNORECASE,
        ),
        2,
    ),
    (
        "version",  # 2.3.1, v2.4.2, v1.2 (an IP address reads as one too: both are facts)
        re.compile(
            r"[vV\d](?<![\w.][vV\d])(?:(?<=[vV])\d+\.\d+|(?<=\d)\d*\.\d+\.\d+)(?:\.\d+)*"
            r"(?:-[0-9A-Za-z.]+)?(?![\w.])"
        ),
        3,
    ),
    ("env", re.compile(r"[A-Z](?<![\w.-][A-Z])[A-Z0-9]*(?:_[A-Z0-9]+)+(?![\w-])"), 3),
    (
        "function",  # camelCase or snake_case names of code: validateEmailPattern(), get_user()
        re.compile(
            r"[a-z_](?<![\w.][a-z_])(?:[a-z][a-z0-9]*(?:[A-Z][a-z0-9]+)+(?:\(\))?|\w*_\w*\(\))"
            r"(?![\w(])"
        ),
        2,
    ),
    ("identifier", re.compile(r"#(?<![\w#]#)[A-Za-z0-9]*\d[A-Za-z0-9]*(?![\w])"), 3),
    (  # a code of capitals and digits, both: a reservation (OBUT9V), a flight (HAT078)
        "identifier",
        re.compile(
            # a digit and a capital among all its chars, the first one's included: 4XGCCM
            r"[A-Z0-9](?<![\w.#-][A-Z0-9])(?:(?<=\d)|(?=[A-Z0-9]*\d))(?:(?<=[A-Z])|(?=[A-Z0-9]*[A-Z]))"
            r"[A-Z0-9]{4,11}(?![\w-])"
        ),
        2,
    ),
    (
        "quantity",  # a number with a unit, or a ratio n/m
        re.compile(
            r"\d(?:(?<![\w.]\d)[\d,]*+(?:\.\d+)?\s?" + _UNITS + r"(?![\w/])"
            r"|(?<![\w./]\d)\d*+/\d+(?![\w/.]))"
        ),
        2,
    ),
    (
        "identifier",
        re.compile(r"[A-Za-z](?<![\w./-][A-Za-z])\w*+(?:[-.:]\w+)+(?![\w/-])"),
        2,
    ),
    # identifiers of any domain, by their shape (issue 19): snake_case with digits
    # (credit_card_9513926, chen_johnson_4204), then bare numbers (item ids, zip codes),
    # which count only by their use (see ``Fact.score``)
    (
        "identifier",
        re.compile(r"[A-Za-z](?<![\w./#-][A-Za-z])[A-Za-z0-9]*(?:_[A-Za-z0-9]+)*_\d\w*"),
        2,
    ),
    ("number", re.compile(r"\d(?<![\w.:/#+-]\d)\d{4,}(?![\w.:/%-])"), 1),
)
_WEIGHT = {kind: weight for kind, _, weight in _KINDS} | {"argument": 3}
#: An identifier without digits is a fact only with one of these parts (a service's usual
#: names) or at least two separators; ``read-only`` and ``well-known`` are words, not names.
_SERVICE_PARTS = frozenset(
    "api service svc worker web app db database cache redis postgres mysql mongo kafka proxy "
    "gateway server primary replica queue broker controller operator agent node cluster pod "
    "deployment ingress frontend backend auth payments checkout ledger loki prometheus grafana "
    "nginx envoy istio etcd coredns kube".split()
)
_WORDS = re.compile(r"[a-z]+")
_DIGIT = re.compile(r"\d")


@dataclass(slots=True)
class Fact:
    """One fact: its ``value`` (as written, spaces collapsed), ``kind``, the id of the first
    message it was seen in and the line there, how many messages hold it, and how it was
    used: ``stated`` by the agent (its text, its tool calls' arguments), ``asked`` by the
    user (a request), ``carried`` from an earlier summary, ``noise``: seen only on noise
    lines of tool output (healthy table rows, listings, object metadata)."""

    value: str
    kind: str
    message_id: str
    line: str
    messages: int = 1
    stated: bool = False
    order: int = 0
    asked: bool = False
    carried: bool = False
    noise: bool = True
    error: bool = False  # seen on a line that reports an error or a failure
    _seen: set[str] = field(default_factory=set, repr=False)

    @property
    def score(self) -> int:
        """Higher first: kind weight (-1 for a time of day without its date: a schedule's
        times are rarely what a task turns on), +3 stated by the agent, +2 asked by the user, +5 carried
        from an earlier summary, +2 on a line that reports an error, + up to 3 for
        recurrence. 0 (never pinned): a bare number nobody used (not stated, asked, carried
        nor recurring), a fact seen only on noise lines and never used."""
        used = self.stated or self.asked or self.carried
        if not used and (self.noise or (self.kind == "number" and self.messages < 2)):
            return 0
        return (
            _WEIGHT[self.kind]
            - (self.kind == "timestamp" and ":" in self.value and "-" not in self.value)
            + 3 * self.stated
            + 2 * self.asked
            + 5 * self.carried  # pinned or concluded before: kept ahead (no telephone game)
            + 2 * self.error
            + min(self.messages - 1, 3)
        )


#: Lines of tool output that are noise: a healthy row of a table (``1/1 Running 0``), a
#: directory listing (``ls -l`` rows, bare paths from ``find``), ``kubectl describe`` object
#: metadata. Their facts are pinned only if used elsewhere (issue 19: pinned facts were a
#: dump of healthy pod rows and listings).
_NOISE_LINE = re.compile(
    r"\b(\d+)/\1\s+Running\s+0\b"
    r"|^\s*[-dlcbps][rwxsStT-]{9}[.+@]?\s"
    r"|^\s*[\w.@+~-]*(?:/[\w.@+-]+)+/?\s*$"
    r"|^\s*(?:annotations|labels|selector|tolerations|node-selectors|mounts|volumes|image id|"
    r"container id|controlled by|qos class|priority class name|service account|conditions|"
    r"host port|ips?|node|start time|namespace|priority|controlled by)\s*:",
    re.IGNORECASE,
)
#: The key of a ``key=value`` that is a setting (a log line's ``latency_ms=212`` is not).
_CONFIG_KEY = re.compile(
    r"restart|replica|retr|limit|timeout|max|min|size|count|port|pool|thread|worker|concurren",
    re.IGNORECASE,
)
#: A line that reports an error or a failure: its facts are what an investigator needs.
_ERROR_LINE = re.compile(
    r"\b(?:error|err|fatal|panic|exception|traceback|fail(?:ed|ure|ing)?|refused|timed? ?out|"
    r"exhausted|oomkilled|killed|denied|crash\w*|unavailable|unhealthy|evicted|throttl\w*|"
    r"critical|backoff|5\d\d)\b",
    re.IGNORECASE,
)
#: Values that are never facts, wherever they are.
_NEVER = frozenset({"/dev/null", "/bin/sh", "/bin/bash", "/usr/bin/env", "/tmp", "/dev/stdout"})


def normal(text: str) -> str:
    """``text`` case-folded with runs of white space as one space: how a fact's presence in
    a summary is tested (``Exit Code: 137`` is in "exit code:   137")."""
    return " ".join(text.casefold().split())


#: A shortened result's note pointing at its original: ``recall("f6d87949"``.
_CITED = re.compile(r'recall\("([^"\s]{1,80})"')


#: Cheap necessary conditions of some kinds' patterns (issue 22: the scans were most of the
#: fact guard's CPU): a piece of text that every match of the pattern contains. A text in
#: which a pattern's gate finds nothing holds no match, so :func:`find` skips that pattern's
#: scan. Keyed by the pattern's source: a pattern that is changed loses its gate (it is then
#: scanned, as before) until its gate is written again. Regex gates open with a literal
#: char, which ``re`` finds at C speed.
_REGEX_GATES: dict[str, re.Pattern[str]] = {
    # path a/b.py: its last segment, ".", a letter
    r"\w(?<!\w\w)[\w.-]*+(?:/[\w.@+-]+)+\.[A-Za-z]\w{0,5}\b": re.compile(r"/[\w.@+-]+\.[A-Za-z]"),
    # version: "." then a digit
    r"[vV\d](?<![\w.][vV\d])(?:(?<=[vV])\d+\.\d+|(?<=\d)\d*\.\d+\.\d+)(?:\.\d+)*"
    r"(?:-[0-9A-Za-z.]+)?(?![\w.])": re.compile(r"\.\d"),
    # env: "_" then a capital or a digit
    r"[A-Z](?<![\w.-][A-Z])[A-Z0-9]*(?:_[A-Z0-9]+)+(?![\w-])": re.compile(r"_[A-Z0-9]"),
    # snake_case with digits: "_" then a digit
    r"[A-Za-z](?<![\w./#-][A-Za-z])[A-Za-z0-9]*(?:_[A-Za-z0-9]+)*_\d\w*": re.compile(r"_\d"),
}
#: The same for case-insensitive patterns, as words of which each group must have one in the
#: lower-cased text; used on ASCII text only (``re``'s IGNORECASE matches ``ſ`` for ``s``,
#: ``İ`` for ``i``, which ``str.lower`` does not give).
_WORD_GATES: dict[str, tuple[tuple[str, ...], ...]] = {
    r"[TtSsRrCc](?<!\w[TtSsRrCc])(?i:(?<=t)race|(?<=s)pan|(?<=r)equest|(?<=c)orrelation)"
    r"[_-]?(?i:id)[=: ]+([\w-]{6,})": (("race", "pan", "equest", "orrelation"), ("id",)),
    r"(?i:[ers](?<![\w.-][ers])(?:(?<=e)xit|(?<=r)eturn|(?<=s)tatus)[ _-]?"
    r"(?:code|status)\s*[=:]?\s*\d{1,3})(?!\d)": (("xit", "eturn", "tatus"), ("code", "status")),
}


@functools.lru_cache(maxsize=8)
def _gated_kinds(
    kinds: tuple[tuple[str, re.Pattern[str], int], ...],
) -> tuple[tuple[str, re.Pattern[str], Any, Any], ...]:
    """``(kind, pattern, regex gate, word gate)`` for each of ``kinds`` (gates None: none)."""
    return tuple(
        (kind, pattern, _REGEX_GATES.get(pattern.pattern), _WORD_GATES.get(pattern.pattern))
        for kind, pattern, _ in kinds
    )


@functools.lru_cache(maxsize=1_024)
def _config_setting(key: str) -> bool:
    """The key of a ``key=value`` names a setting (:data:`_CONFIG_KEY`); keys repeat on
    every line of a log, so it is asked once per key."""
    return _CONFIG_KEY.search(key) is not None


def find(text: str) -> list[tuple[str, str, int]]:
    """The facts in ``text`` as ``(value, kind, offset)``, in order of appearance. Each char
    belongs to one fact at most: the first kind (most specific) to match it takes it."""
    taken = bytearray(len(text))  # 1 where a fact already is: one C-level scan per check
    out: list[tuple[str, str, int]] = []
    for m in _CITED.finditer(text):  # offpath's own pointer to a message, not a fact of it:
        # a random id (its prefix), pinned or not by chance (all digits: a number)
        taken[m.start(1) : m.end(1)] = b"\x01" * (m.end(1) - m.start(1))
    low: str | None = None  # the lower-cased text, for the word gates (ASCII text only)
    for kind, pattern, gate, words in _gated_kinds(_KINDS):
        if gate is not None and gate.search(text) is None:
            continue  # no match can be in this text
        if words is not None and text.isascii():
            if low is None:
                low = text.lower()
            if not all(any(w in low for w in group) for group in words):
                continue
        identifier, config, quantity = kind == "identifier", kind == "config", kind == "quantity"
        for m in pattern.finditer(text):
            group = m.lastindex or 0  # a kind with a group: the value is the group (the last
            # matched, for a kind whose alternatives have a group each)
            start, end = m.span(group)
            if taken.find(1, start, end) != -1:
                continue
            value = m.group(group).rstrip(".,:;")
            if "\n" in value or (identifier and not _is_name(value)):
                continue
            if value in _NEVER:
                continue
            if config and "=" in value and not _config_setting(value.split("=")[0]):
                continue  # key=value in a log line: a setting only by its key's name
            if "  " in value or "\t" in value:
                value = " ".join(value.split())
            if quantity and value.count("/") > 1:
                continue
            taken[start:end] = b"\x01" * (end - start)
            out.append((value, kind, start))
    out.sort(key=lambda f: f[2])
    return out


def _is_name(value: str) -> bool:
    if _DIGIT.search(value):
        return len(value) >= 4
    if value.count("-") + value.count(".") + value.count(":") >= 2:
        return not value.endswith((".py", ".md")) or "/" in value
    return any(w in _SERVICE_PARTS for w in _WORDS.findall(value.lower()))


#: An entry of an earlier summary's Pinned facts: a quoted line, or values by message.
_QUOTED = re.compile(r"^- `(?P<line>.*)` \((?P<id>[^()\s;]+)(?:; [^()]*)?\)$")
_LISTED = re.compile(r"^- also in (?P<id>\S+): (?P<values>.*)$")
#: How a summary points at a clipped request's message (:func:`frontier.into_summary`).
_CITATION = re.compile(r' \(whole: recall\("[^"]*"\)\)')
#: How offpath points at an archived message (a shortened result's marker, a summary):
#: ``recall("48596bb7", offset=1200)``.
_RECALL_CALL = re.compile(r'recall\("[^"\n]{1,80}"(?:, offset=\d+)?\)')
#: The compact line of carried facts that found no room with their message ids.
_EARLIER_LINE = "\n- earlier, each found by `recall`: "
_EARLIER = re.compile(r"^- earlier, each found by `recall`: (?P<values>.*)$")
#: What follows a kind's label on the line of the values stated (:func:`pin`).
STATED_LABEL = " (stated)"
#: The smallest section budget (chars) that lists the values stated on lines of their own:
#: a label more per kind; below it they share their kind's line (issue 19's small budgets,
#: tau-bench at 4,000 / 1,500: 95.1% of the ground truth visible, 93.8% with the lines apart).
STATED_LINE_MIN_BUDGET = 1_000
#: The smallest section budget (chars) that keeps a quarter for quoted lines (:func:`pin`).
QUOTED_SHARE_MIN_BUDGET = 1_000
#: A line of values of one kind (:func:`pin`): ``- ids: OBUT9V, credit_card_9513926``; the
#: values the agent or the user stated are on a line of their own, ``- ids (stated): ...``,
#: so that a summary that carries them keeps them ranked as stated (a long run's tenth
#: summary had dropped the names the agent stated for paths that a traceback printed).
_VALUES = re.compile(
    r"^- (?:ids|times|errors|settings|amounts|numbers|versions|paths|urls)"
    rf"(?P<stated>{re.escape(STATED_LABEL)})?: (?P<values>.+)$"
)


def _blocks(message: BaseMessage) -> Iterable[tuple[str, str, str]]:
    """``(text, role, message_id)`` for each block of a message worth reading for facts.
    ``role``: ``agent`` (its text, the first line of each of its tool calls' arguments: its
    conclusions and actions), ``user`` (a request), ``carried`` (an earlier summary: what
    was concluded before; its pinned entries are read as the line they quote and the message
    they name, so a fact pinned again keeps its source), ``data`` (tool output, the rest of a
    multi-line argument)."""
    from offpath.compaction.prompt import render_content

    mid = str(message.id)
    if is_summary(message):
        text = summary_body(message)
        cut = min(
            (
                i
                for i in (
                    text.find(PINNED_HEADING),
                    text.find(SINCE_HEADING),
                    text.find(SWAP_HEADING),
                )
                if i >= 0
            ),
            default=len(text),
        )
        body, pinned = text[:cut], text[cut:]
        yield _CITATION.sub("", body), "carried", mid  # ids offpath cites are not facts
        for line in pinned.splitlines()[1:]:
            if quoted := _QUOTED.match(line.strip()):
                yield quoted["line"], "carried", quoted["id"]
                if args := _CALL_ARGS.findall(quoted["line"]):  # a quoted tool call: its
                    # arguments were facts by their use, whatever their shape (SDZQKO)
                    named = [a or b for a, b in args if _is_token(a or b)]
                    if named:
                        yield ", ".join(named), "stated values", quoted["id"]
            elif listed := _LISTED.match(line.strip()):
                yield listed["values"].replace("`", ""), "carried", listed["id"]
            elif compact := _EARLIER.match(line.strip()):
                yield compact["values"].replace("`", ""), "carried", mid
            elif values := _VALUES.match(line.strip()):
                yield values["values"], "stated values" if values["stated"] else "values", mid
        return
    role = {"ai": "agent", "human": "user"}.get(message.type, "data")
    text = render_content(message.content)
    if 'recall("' in text:  # a shortened result's pointer: ids offpath cites are not facts
        text = _RECALL_CALL.sub("recall(...)", text)
    yield text, role, mid
    for call in getattr(message, "tool_calls", None) or []:
        # the call with the first line of each argument is the agent's action (stated); the
        # rest of a multi-line argument (a heredoc, a file's new content) is data it wrote
        args = call.get("args") or {}
        heads = {k: v.split("\n", 1)[0] if isinstance(v, str) else v for k, v in args.items()}
        yield (
            f"{call.get('name')}({json.dumps(heads, ensure_ascii=False, default=str)})",
            "agent",
            mid,
        )
        for value in args.values():
            if isinstance(value, str) and "\n" in value:
                yield value.split("\n", 1)[1], "data", mid


def _split_values(text: str) -> list[str]:
    """The values of a line :func:`pin` lists by value: separated by ``, ``, one that holds
    the separator quoted as code."""
    out: list[str] = []
    for m in re.finditer(r"`([^`]*)`|([^,`]+(?:,(?! )[^,`]*)*)", text):
        value = (m.group(1) if m.group(1) is not None else m.group(2) or "").strip()
        if value:
            out.append(value)
    return out


#: A tool argument's value that is an identifier by its use: one token, no spaces.
_TOKEN_VALUE = re.compile(r"^[#\w][\w.:/@#+-]{2,79}$")


#: The scalar arguments of a quoted tool call's line: ``get_booking({"booking": "SDZQKO"})``.
_CALL_ARGS = re.compile(r'"[\w.-]{1,40}": (?:"([#\w][\w.:/@#+-]{2,79})"|(\d{4,20}))(?=[,}\]])')


def _is_token(text: str) -> bool:
    """``text`` (a tool argument's scalar value) names something: a token with a digit or a
    separator, or in capitals (``XEHQWM``); not a word, not a count under 4 digits."""
    if text.isdigit() and len(text) < 4:  # a count, a limit: not a name
        return False
    return bool(_TOKEN_VALUE.match(text) and not text.isalpha()) or (
        text.isupper() and 4 <= len(text) <= 12
    )


def _arguments(message: BaseMessage) -> Iterable[tuple[str, str]]:
    """``(value, line)`` for each scalar argument of the message's tool calls that is one
    token (an id, a name, a number: ``{"reservation_id": "XEHQWM"}``), with the call's line:
    what the agent passed to a tool is a fact whatever its shape (issue 19)."""
    for call in getattr(message, "tool_calls", None) or []:
        args = call.get("args") or {}
        line = f"{call.get('name')}({json.dumps(args, ensure_ascii=False, default=str)[:200]})"
        stack: list[Any] = [args]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item[:50])
            elif isinstance(item, str | int) and not isinstance(item, bool):
                if _is_token(str(item)):
                    yield str(item), line


@dataclass(frozen=True, slots=True)
class _Seen:
    """One value's occurrences in one message: the first one's kind, line and message id
    (a pinned entry of an earlier summary names its own), the ids of the blocks it was
    found in by :func:`find` (a tool argument alone counts no message), and how it was
    used there (see :class:`Fact`)."""

    value: str
    kind: str
    message_id: str
    line: str
    found_in: tuple[str, ...]
    stated: bool
    asked: bool
    carried: bool
    clear: bool  # seen at least once off a noise line
    error: bool


def _observe(m: BaseMessage) -> tuple[_Seen, ...]:
    """The facts of one message, in order of first appearance: what :func:`extract` merges.
    Depends on nothing but the message, so it is computed once per message (cached)."""
    seen: dict[str, dict[str, Any]] = {}
    mid0 = str(m.id)
    for value, line in _arguments(m):  # an identifier by its use: passed to a tool
        entry = seen.get(value)
        if entry is None:
            entry = seen[value] = {
                "kind": "argument",
                "message_id": mid0,
                "line": line,
                "found_in": [],
                "stated": False,
                "asked": False,
                "carried": False,
                "clear": False,
                "error": False,
            }
        entry["stated"] = entry["clear"] = True
    for text, role, mid in _blocks(m):
        if role in ("values", "stated values"):  # a summary's values by kind: each one
            # carried as it is, stated still if it was
            for value in _split_values(text):
                if value not in seen and not looks_like_instruction(value):
                    found = find(value)
                    whole = len(found) == 1 and found[0][0] == value
                    seen[value] = {
                        "kind": found[0][1] if whole else "argument",
                        "message_id": mid,
                        "line": value,
                        "found_in": [mid],
                        "stated": role == "stated values",
                        "asked": False,
                        "carried": True,
                        "clear": True,
                        "error": False,
                    }
            continue
        instruction: dict[int, bool] = {}  # line start -> the line reads as one
        noisy: dict[int, bool] = {}  # line start -> a noise line (tool output only)
        errors: dict[int, bool] = {}  # line start -> it reports an error
        test_lines = may_hold_instruction(text)
        data = role == "data"
        for value, kind, offset in find(text):
            entry = seen.get(value)
            line = ""
            start = 0
            if entry is None or test_lines or data:  # the line is needed
                start = text.rfind("\n", 0, offset) + 1
                end = text.find("\n", offset)
                line = text[start : end if end >= 0 else len(text)]
                if test_lines:
                    if start not in instruction:
                        instruction[start] = looks_like_instruction(line)
                    if instruction[start]:
                        continue
            if entry is None:
                entry = seen[value] = {
                    "kind": kind,
                    "message_id": mid,
                    "line": _around(line, offset - start, value),
                    "found_in": [mid],
                    "stated": False,
                    "asked": False,
                    "carried": False,
                    "clear": False,
                    "error": False,
                }
            elif mid not in entry["found_in"]:
                entry["found_in"].append(mid)
            if data:
                if start not in noisy:
                    noisy[start] = bool(_NOISE_LINE.search(line))
                    errors[start] = not noisy[start] and bool(_ERROR_LINE.search(line))
                if not noisy[start]:
                    entry["clear"] = True
                entry["error"] = entry["error"] or errors[start]
            else:
                entry["clear"] = True
                entry["stated"] = entry["stated"] or role == "agent"
                entry["asked"] = entry["asked"] or role == "user"
                entry["carried"] = entry["carried"] or role == "carried"
    return tuple(
        _Seen(
            value,
            e["kind"],
            e["message_id"],
            e["line"],
            tuple(e["found_in"]),
            e["stated"],
            e["asked"],
            e["carried"],
            e["clear"],
            e["error"],
        )
        for value, e in seen.items()
    )


#: Messages whose facts are kept per worker process (issue 22: a compaction re-read every
#: message's facts: the plan's shortened results, the guard, the check before the swap and
#: the loss report each extracted the same messages again, and a message kept at one
#: compaction is read again when the next one removes it).
OBSERVED_CACHE_SIZE = 8_192


class _Key:
    """A message by what its facts depend on (type, id, summary marker, content, tool
    calls), hashed; it holds the message only until its facts are computed."""

    __slots__ = ("digest", "message")

    def __init__(self, message: BaseMessage) -> None:
        content = message.content
        calls = getattr(message, "tool_calls", None) or ()
        text = "\x00".join(
            (
                message.type,
                str(message.id),
                "s" if is_summary(message) else "",
                content if isinstance(content, str) else repr(content),
                repr(calls) if calls else "",
            )
        )
        self.digest = hashlib.blake2b(
            text.encode("utf-8", "surrogatepass"), digest_size=16
        ).digest()
        self.message: BaseMessage | None = message

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and other.digest == self.digest


@functools.lru_cache(maxsize=OBSERVED_CACHE_SIZE)
def _observed(key: _Key) -> tuple[_Seen, ...]:
    message, key.message = key.message, None  # the cache keeps the digest, not the text
    assert message is not None
    return _observe(message)


#: Results of :func:`extract` kept per process, by the digests of their messages in order.
MERGED_CACHE_SIZE = 8
_MERGED: OrderedDict[tuple[bytes, ...], tuple[Fact, ...]] = OrderedDict()
_MERGED_LOCK = threading.Lock()


def warm(messages: Iterable[BaseMessage]) -> None:
    """Find the facts of each of ``messages`` and keep them (per process, as :func:`extract`
    does) before anything needs them: shortening a tool result (its marker lists the facts
    of the part not shown), the fact guard's pins and the loss report of a compaction then
    find them ready. The middleware calls it for the messages each model call is the first
    to see, on a background thread, while the model answers (issue 18: a run shortening
    older results found the facts of about 280,000 chars of an SRE session in its model
    calls' path)."""
    for m in messages:
        _observed(_Key(m))


def extract(messages: Sequence[BaseMessage]) -> list[Fact]:
    """The facts of ``messages``, one per distinct value, with where each was first seen
    (the line it is on) and how it was used (see :class:`Fact`).

    Lines that read as instructions to an assistant (injected text) are skipped: their
    contents are never pinned into a summary, which the model reads in the user's role.

    Each message's facts are found once per process and merged here in order (issue 22:
    a compaction pays only for the messages it has not read before); the result is the
    same as reading the messages afresh. The last few results are kept too (the guard and
    the loss report of one compaction extract the same removed messages): their facts are
    shared between the calls, read them and never change them.
    """
    keys = [_Key(m) for m in messages]
    digests = tuple(k.digest for k in keys)
    with _MERGED_LOCK:
        kept = _MERGED.get(digests)
        if kept is not None:
            _MERGED.move_to_end(digests)
            return list(kept)
    facts: dict[str, Fact] = {}
    for key in keys:
        for seen in _observed(key):
            fact = facts.get(seen.value)
            if fact is None:
                fact = facts[seen.value] = Fact(
                    seen.value, seen.kind, seen.message_id, seen.line, order=len(facts)
                )
                fact._seen.add(seen.message_id)
            for mid in seen.found_in:
                if mid not in fact._seen:
                    fact._seen.add(mid)
                    fact.messages += 1
            if seen.clear:
                fact.noise = False
            fact.stated = fact.stated or seen.stated
            fact.asked = fact.asked or seen.asked
            fact.carried = fact.carried or seen.carried
            fact.error = fact.error or seen.error
    with _MERGED_LOCK:
        _MERGED[digests] = tuple(facts.values())
        while len(_MERGED) > MERGED_CACHE_SIZE:
            _MERGED.popitem(last=False)
    return list(facts.values())


def rank(facts: Iterable[Fact]) -> list[Fact]:
    """``facts`` most important first: by :attr:`Fact.score`, then first seen first."""
    return sorted(facts, key=lambda f: (-f.score, f.order))


def stated_facts(messages: Sequence[BaseMessage]) -> list[Fact]:
    """The facts the agent stated itself, earlier summaries included (what the fidelity
    benchmark marks in a transcript)."""
    return [f for f in extract(messages) if f.stated or f.carried]


@dataclass(frozen=True, slots=True)
class Pinned:
    """What :func:`pin` added: the entries, and how many facts they cover."""

    entries: tuple[str, ...]
    facts: int


def pin(
    summary_text: str,
    removed: Sequence[BaseMessage],
    max_chars: int,
    kept: Sequence[BaseMessage] = (),
    header: str | None = None,
) -> tuple[str, Pinned]:
    """``summary_text`` with a **Pinned facts** section holding, most important first, the
    facts of ``removed`` that neither the summary nor the ``kept`` messages contain (in any
    letter case), in at most ``max_chars`` chars (0: no section).

    The facts are listed by value first, densely, one line per kind (``- ids: OBUT9V,
    credit_card_9513926``; ``- times: 2024-05-20``): an identifier costs its length and two
    chars, where quoting its line cost ~90 (issue 19: at a 4,000-char threshold the section
    held two or three facts); on a budget of :data:`STATED_LINE_MIN_BUDGET` or more, those
    the agent or the user stated on a line of their own (``- ids (stated): ...``), which the
    next summary reads back as stated (issue 22). The facts an earlier summary carried come
    first (no telephone game), in up to 60% of the budget while new facts wait, then the new
    ones by rank (:func:`rank`), then the carried ones left. A fact inside a value listed already is not
    listed again. What the values leave (and, on a budget of 1,000 chars or more, a quarter
    kept for them) quotes the lines the highest-ranked facts were found on (at most
    :data:`MAX_LINE_CHARS` chars, in conversation order, citing their message; near-duplicate
    lines once, "; +N similar"); a quoted line takes the place of the values it holds.
    ``recall`` finds each value in the archive. ``header``: the section's heading line
    (default: the Pinned facts one). Returns the text and what was pinned; the text is
    unchanged when nothing is missing."""
    if max_chars <= 0:
        return summary_text, Pinned((), 0)
    from offpath.compaction.prompt import render_content

    present = normal(summary_text + "\n" + "\n".join(render_content(m.content) for m in kept))
    if header is None:
        header = f"{PINNED_HEADING} (`recall` finds each):"
    header = f"\n\n{header}"
    budget = max_chars - len(header)
    if budget <= 0:
        return summary_text, Pinned((), 0)
    # a quoted line's length follows the budget: a small one is better spent on values
    line_max = max(60, min(MAX_LINE_CHARS, budget // 6))
    position = {str(m.id): i for i, m in enumerate(removed)}
    ranked = [f for f in rank(extract(removed)) if f.score > 0]
    absent: dict[str, bool] = {}  # value -> not in the summary nor the keep window

    def missing(fact: Fact) -> bool:
        # tested only for a fact that would fit the budget left: the summary and the keep
        # window are tens of thousands of chars, a thread's facts hundreds (issue 13)
        if fact.value not in absent:
            absent[fact.value] = normal(fact.value) not in present
        return absent[fact.value]

    pinned = ""  # the values listed and the lines quoted so far
    listed: dict[str, list[Fact]] = {}  # label -> facts listed by value, in rank order
    used = 0
    quoted: list[tuple[int, int, str, str]] = []
    similar: dict[str, int] = {}
    lines_text = ""

    # 0. what the kept messages name (the agent's or the user's words, a tool's argument)
    #    that a removed tool result holds: that line (its record) is quoted first, in up to
    #    a quarter of the budget, though the value itself stays in view (issue 19: a
    #    compaction prepared again after a message named an id kept the name, not the record;
    #    a kept result that echoes the id may not hold the record either)
    if kept:
        named = normal(
            "\n".join(t for m in kept for t, role, _ in _blocks(m) if role in ("agent", "user"))
        )
        data_ids = {str(m.id) for m in removed if m.type == "tool"}
        said = normal(summary_text)
        for fact in ranked:
            if budget // 4 - used < 60:
                break
            if fact.message_id not in data_ids or fact.value in lines_text:
                continue
            value = normal(fact.value)
            if value not in named or value in said:
                continue
            line = _around(fact.line, max(0, fact.line.find(fact.value)), fact.value, line_max)
            if all(normal(v) == value or normal(v) in present for v, _, _ in find(line)):
                continue  # the line says nothing the kept messages do not: no record
            entry = f"\n- `{line.replace('`', chr(39))}` ({cite(fact.message_id)})"
            if used + len(entry) + 14 > budget // 4:
                continue
            signature = _SIGNATURE.sub("#", fact.line.casefold())
            similar[signature] = 0
            quoted.append((position.get(fact.message_id, 0), fact.order, entry, signature))
            used += len(entry) + 14
            lines_text += "\n" + line
            pinned += "\n" + line

    def cost(fact: Fact, label: str) -> int:
        return len(_shown(fact.value)) + (2 if listed.get(label) else len(label) + 5)

    def add(fact: Fact, room: int) -> None:
        nonlocal used, pinned
        if fact.value in pinned or room - used < len(fact.value) + 2:
            return
        label = _label(fact, budget >= STATED_LINE_MIN_BUDGET)
        took = cost(fact, label)
        if used + took > room or not missing(fact):
            return
        listed.setdefault(label, []).append(fact)
        used += took
        pinned += "\n" + fact.value

    # 1. values: carried first, then new, then the carried left; on a large budget a quarter
    #    waits for the quoted lines (filled with values after them when they leave it)
    values_room = budget - (budget // 4 if budget >= QUOTED_SHARE_MIN_BUDGET else 0)
    carried_room = values_room * 3 // 5 if any(not f.carried for f in ranked) else values_room
    for fact in ranked:
        if fact.carried:
            add(fact, carried_room)
    for fact in ranked:
        if not fact.carried:
            add(fact, values_room)
    for fact in ranked:
        if fact.carried:
            add(fact, values_room)

    # 2. quoted lines, most important first, in what the values leave: a line takes the
    #    place of the values listed from it (its message's values that are on it)
    for fact in ranked:
        if budget - used < 60 and not listed:
            break
        if fact.value in lines_text or fact.line in ("", fact.value) or not missing(fact):
            continue
        signature = _SIGNATURE.sub("#", fact.line.casefold())
        if signature in similar:
            similar[signature] += 1
            continue
        line = fact.line
        if len(line) > line_max:
            line = _around(line, max(0, line.find(fact.value)), fact.value, line_max)
        if _blob(line):  # a fact inside one long line of JSON: listed by value
            continue
        entry = f"\n- `{line.replace('`', chr(39))}` ({cite(fact.message_id)})"
        on_line = {
            label: [f for f in facts if f.message_id == fact.message_id and f.value in line]
            for label, facts in listed.items()
        }
        freed = sum(
            sum(len(_shown(f.value)) + 2 for f in facts)
            + (len(label) + 3 if len(facts) == len(listed[label]) else 0)
            for label, facts in on_line.items()
            if facts
        )
        if len(entry) + 14 > budget - used + freed:  # with room for "; +N similar"
            continue
        for label, facts in on_line.items():
            listed[label] = [f for f in listed[label] if f not in facts]
        similar[signature] = 0
        quoted.append((position.get(fact.message_id, 0), fact.order, entry, signature))
        used += len(entry) + 14 - freed
        lines_text += "\n" + line
        pinned += "\n" + line
    # 3. the values that still fit, in what the quoted lines left
    for fact in ranked:
        add(fact, budget)

    entries = []
    for _, _, entry, signature in sorted(quoted):
        if similar[signature]:
            entry = entry[:-1] + f"; +{similar[signature]} similar)"
        entries.append(entry)
    for label, facts in listed.items():
        if facts:
            entries.append(f"\n- {label}: " + ", ".join(_shown(f.value) for f in facts))
    if not entries:
        return summary_text, Pinned((), 0)
    covered = sum(fact.value in pinned and missing(fact) for fact in ranked)
    return summary_text.rstrip() + header + "".join(entries), Pinned(tuple(entries), covered)


#: The label of the line a fact is listed on by value, by its kind (the rest: ``ids``).
_LABELS = {
    "timestamp": "times",
    "error_code": "errors",
    "config": "settings",
    "quantity": "amounts",
    "number": "numbers",
    "version": "versions",
    "path": "paths",
    "url": "urls",
}


def _label(fact: Fact, stated_line: bool = True) -> str:
    """The line ``fact`` is listed on: its kind's label (a value known only as a tool's
    argument: by the kind :func:`find` gives it whole, a date, a number, else ``ids``),
    followed by :data:`STATED_LABEL` for a value the agent or the user stated when
    ``stated_line`` (its own line: the next summary reads it back as stated)."""
    kind = fact.kind
    if kind == "argument":
        found = find(fact.value)
        if len(found) == 1 and found[0][0] == fact.value:
            kind = found[0][1]
    stated = stated_line and (fact.stated or fact.asked)
    return _LABELS.get(kind, "ids") + (STATED_LABEL if stated else "")


def _shown(value: str) -> str:
    """``value`` as a dense line lists it: bare, quoted as code only when it holds the
    separator (``, ``); never a backtick of its own."""
    value = value.replace("`", "'")
    return f"`{value}`" if ", " in value else value


#: A token someone may name: an id, a code, a name with digits or separators.
_NAMED = re.compile(r"(?<![\w#.-])[#A-Za-z0-9][\w.#:/-]{3,60}(?<![.:/-])(?![\w-])")


def _looks_named(token: str) -> bool:
    """``token`` reads as a name rather than a word: it holds a digit, ``_`` or ``#``, or it
    is all capitals (``XEHQWM``)."""
    return (
        any(c.isdigit() for c in token)
        or "_" in token
        or "#" in token
        or (token.isupper() and len(token) >= 5)
    )


def swap_check(
    later: Sequence[BaseMessage],
    removed: Sequence[BaseMessage],
    kept: Sequence[BaseMessage],
    summary_text: str,
    max_chars: int,
) -> tuple[str, int]:
    """The check before the swap (issue 19, after "Slipstream", arXiv 2605.08580, without an
    LLM): the identifiers that the ``later`` messages (written while the summary was
    prepared) name in what the agent or the user says or passes to a tool (not in tool
    output), which only the ``removed`` part held (not the summary, not the ``kept``
    messages), quoted with their line and message under :data:`SWAP_HEADING`, in at most
    ``max_chars`` chars. Returns the section ("" when none is needed) and how many such
    identifiers did not fit (the caller re-prepares the compaction then)."""
    from offpath.compaction.prompt import render_content

    visible = normal(summary_text + "\n" + "\n".join(render_content(m.content) for m in kept))
    refs: dict[str, str] = {}
    for m in later:
        named = [v for v, _ in _arguments(m)]
        for text, role, _ in _blocks(m):
            if role == "data":  # what the agent or the user names, not tool output
                continue
            named += [v for v, k, _ in find(text) if k not in ("timestamp", "quantity")]
            named += [t for t in _NAMED.findall(text) if _looks_named(t)]
        for value in named:
            if normal(value) not in visible:
                refs.setdefault(normal(value), value)
    if not refs:
        return "", 0
    entries: list[str] = []
    missing = 0
    header = f"{SWAP_HEADING} (named by messages that came after it; `recall` reads them):"
    room = max_chars - len(header) - 2
    found: set[str] = set()
    for m in removed:
        for text, _, mid in _blocks(m):
            low = text.casefold()
            for key, value in refs.items():
                if key in found:
                    continue
                at = low.find(value.casefold())
                if at < 0:
                    continue
                start = text.rfind("\n", 0, at) + 1
                end = text.find("\n", at)
                line = text[start : end if end >= 0 else len(text)]
                if looks_like_instruction(line):
                    continue
                found.add(key)
                entry = (
                    f"\n- `{_around(line, at - start, value).replace('`', chr(39))}` ({cite(mid)})"
                )
                if len(entry) > room:
                    missing += 1
                    continue
                entries.append(entry)
                room -= len(entry)
    if not entries:
        return "", missing
    return header + "".join(entries), missing


#: What makes two lines near duplicates: the same but for their numbers, times and long hex
#: ids (an identifier with letters, ``fact-3``, ``pod-x7``, keeps them apart).
_SIGNATURE = re.compile(r"(?<![\w-])\d[\d:.,/+TZ-]*(?![\w-])|(?<![\w-])[0-9a-f]{8,}(?![\w-])")


def _blob(line: str) -> bool:
    """``line`` (clipped by :func:`_around`) is a piece of one long line of JSON, which says
    little quoted: ``..."15:00:00", "status":...`` or ``...["OI5L9G", "AQLBTL",...`` (issue
    19, tau-bench)."""
    return (line.startswith("...") or line.endswith("...")) and ('":' in line or '", "' in line)


def _around(line: str, offset: int, value: str, most: int = MAX_LINE_CHARS) -> str:
    """``line`` clipped to ``most`` chars (default :data:`MAX_LINE_CHARS`) around ``value``,
    cut at word boundaries."""
    line = " ".join(line.split())
    if len(line) <= most:
        return line
    offset = max(0, line.find(value))
    room = most - len(value)
    start = max(0, offset - room // 2)
    end = min(len(line), start + most)
    start = max(0, end - most)
    if start > 0:
        cut = line.find(" ", start, offset)
        start = cut + 1 if cut >= 0 else start
    if end < len(line):
        cut = line.rfind(" ", offset + len(value), end)
        end = cut if cut > 0 else end
    return ("..." if start else "") + line[start:end] + ("..." if end < len(line) else "")
