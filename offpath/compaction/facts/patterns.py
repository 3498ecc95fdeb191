"""The kinds of fact and how they are found in a text: each kind's regular expressions and
weight, the noise and error lines of tool output, the cheap gates that skip a pattern's scan,
and :func:`find`, which gives each char of a text to one fact at most."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

import ahocorasick

# Kinds, most specific first: a span taken by one kind is not matched again by a later one.
# A kind may have several patterns (tried in turn). Each pattern opens with the char class
# of its first char and checks the char before it by a look-behind *after* that char
# (``\d(?<!\w\d)`` rather than ``\b\d``): the regex engine then skips, in C, every position
# whose char cannot start a fact (the guard's scan is otherwise most of a job's CPU).
_UNITS = (
    r"(?:ms|µs|us|ns|s|sec|secs|seconds?|min|mins|minutes?|h|hrs?|hours?|days?|%|[KMGT]i?B?|"
    r"[KMGT]iB|bytes?|cores?|nanocores|millicores|m?cpus?|m|req/s|rps|qps|ops/s|conns?|connections)"
)
_KINDS: tuple[tuple[str, re.Pattern[str], int], ...] = (
    ("url", re.compile(r"https?://[^\s'\"<>()\[\]{}`]+[^\s'\"<>()\[\]{}`.,;:!?*]"), 3),
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
    ("ticket", re.compile(r"[A-Z](?<![\w.-][A-Z])[A-Z0-9]{1,9}-\d{1,7}(?![\w-]|\.\w)"), 3),
    (
        "trace_id",
        re.compile(
            r"[TtSsRrCc](?<!\w[TtSsRrCc])(?i:(?<=t)race|(?<=s)pan|(?<=r)equest|(?<=c)orrelation)"
            r"[_-]?(?i:id)[=: ]+([\w-]{6,})"
        ),
        3,
    ),
    (
        "uuid",  # a request's or an object's id: 8-4-4-4-12 hex chars
        re.compile(
            r"[0-9a-fA-F](?<![\w-][0-9a-fA-F])[0-9a-fA-F]{7}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
            r"(?![\w-])"
        ),
        3,
    ),
    (
        "sha",  # 7-40 hex chars with a letter and a digit among them
        re.compile(
            r"[0-9a-f](?<![\w.-][0-9a-f])(?=[0-9a-f]{6})(?:(?<=[a-f])|(?=[0-9a-f]{0,38}[a-f]))"
            r"(?:(?<=\d)|(?=[0-9a-f]{0,38}\d))[0-9a-f]{6,39}(?![\w-]|\.\w)"
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
        "address",  # an IPv4 address, its port if any: 10.0.3.17, 10.0.3.17:8080
        re.compile(r"\d(?<![\w.:]\d)\d{0,2}(?:\.\d{1,3}){3}(?::\d{1,5})?(?!\w|:\d|\.\d)"),
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
        "version",  # 2.3.1, v2.4.2, v1.2 (an IP address is taken before, as an address)
        re.compile(
            r"[vV\d](?<![\w.][vV\d])(?:(?<=[vV])\d+\.\d+|(?<=\d)\d*\.\d+\.\d+)(?:\.\d+)*"
            r"(?:-[0-9A-Za-z.]+)?(?!\w|\.\w)"
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
        "quantity",  # a number or a range with a unit (45-55%, 867-918m), or a ratio n/m
        re.compile(
            r"\d(?:(?<![\w.]\d)[\d,]*+(?:\.\d+)?(?:\s?[-\u2013]\s?\d[\d,]*+(?:\.\d+)?)?\s?"
            + _UNITS
            + r"(?![\w/])"
            r"|(?<![\w./]\d)\d*+/\d+(?![\w/]|\.\d))"
        ),
        2,
    ),
    (
        "identifier",
        re.compile(r"[A-Za-z](?<![\w./-][A-Za-z])\w*+(?:[-.:]\w+)+(?![\w/-])"),
        2,
    ),
    # identifiers of any domain, by their shape: snake_case with digits
    # (credit_card_9513926, chen_johnson_4204), then bare numbers (item ids, zip codes),
    # which count only by their use (see ``Fact.score``)
    (
        "identifier",
        re.compile(r"[A-Za-z](?<![\w./#-][A-Za-z])[A-Za-z0-9]*(?:_[A-Za-z0-9]+)*_\d\w*"),
        2,
    ),
    ("number", re.compile(r"\d(?<![\w.:/#+-]\d)\d{4,}(?![\w/%-]|[.:]\w)"), 1),
    # names and line numbers, facts in what the agent or the user writes only (:data:`SAID_ONLY`:
    # tool output, which quotes code, is not scanned for them): a name put in backticks
    # (`build_index`, `minishop`), a line number or range ("line 222", "lines 341-343"), a
    # name written bare: CamelCase (ForeignKey), snake_case (old_name, __init__), a file
    # (models.py), a dotted name (pvsystem.PVSystem), a word of 4+ chars of letters, one run
    # of digits, and letters or none (h5py, sha256; not a hex id such as g3f2a9c1)
    ("name", re.compile(r"`(?=[^`\s]*[A-Za-z])([\w.:/-]{3,80}(?:\(\))?)`"), 2),
    ("line", re.compile(r"[Ll](?<![\w.-][Ll])ines? \d+(?:\s?[-\u2013]\s?\d+)?(?!\w|\.\w)"), 2),
    (
        "term",
        re.compile(
            r"(?<![\w.@/-])(?:"
            r"[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*[A-Z][A-Za-z0-9]*"  # CamelCase
            r"|_*[A-Za-z][A-Za-z0-9]*(?:_+[A-Za-z0-9]+)+_*"  # snake_case
            r"|__[a-z]+__"  # a dunder
            r"|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"  # a dotted name, a file
            r"|(?=[A-Za-z0-9]{4})[A-Za-z]+\d+[A-Za-z]*"  # letters, digits, letters: h5py, utf8
            r")(?:\(\))?(?![\w@/=-]|\.\w)"  # a key before its value (request_id=) is not one
        ),
        2,
    ),
)
#: Kinds found only in what the agent or the user writes (the user's text: not ``term``, a
#: name written bare, which instructions an agent framework appends to each user message
#: are full of); :func:`find` looks for them when told to.
SAID_ONLY = frozenset({"name", "line", "term"})
#: Words a backticked name never is.
_NOT_NAMES = frozenset(
    {
        "true",
        "false",
        "none",
        "null",
        "self",
        "nil",
        "undefined",
        "todo",
        "e.g",
        "i.e",
        "etc",
        "nan",
    }
)
#: How much a fact of each kind counts when ranked (a tool call's argument: 3).
KIND_WEIGHT = {kind: weight for kind, _, weight in _KINDS} | {"argument": 3}
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


#: Lines of tool output that are noise: a healthy row of a table (``1/1 Running 0``), a
#: directory listing (``ls -l`` rows, bare paths from ``find``), ``kubectl describe`` object
#: metadata. Their facts are pinned only if used elsewhere (else pinned facts are
#: a dump of healthy pod rows and listings).
NOISE_LINE = re.compile(
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
ERROR_LINE = re.compile(
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


#: Below this many values, or this many chars of text, :func:`held_in` tests each value with
#: ``in``: building an automaton costs more than the few scans it saves.
_AUTOMATON_MIN_VALUES = 8
_AUTOMATON_MIN_CHARS = 2_000


def _word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def stands_at(text: str, start: int, end: int) -> bool:
    """``text[start:end]`` stands as a token of its own: no letter, digit or ``_`` right
    before or after it, nor a ``-`` or ``.`` joining it to one (``loki`` does not stand in
    ``loki-0``, nor ``api`` in ``checkout-api``; ``loki`` stands in "the loki namespace",
    ``5m`` in ``[5m]``). Only an edge of the value that is a letter, digit or ``_`` is
    tested: a directory (``/srv/app/``) stands in a path it starts (``/srv/app/main.py``)."""
    if start > 0 and (start >= end or _word_char(text[start])):
        before = text[start - 1]
        if _word_char(before) or (before in "-." and start > 1 and _word_char(text[start - 2])):
            return False
    if end < len(text) and (start >= end or _word_char(text[end - 1])):
        after = text[end]
        if _word_char(after) or (
            after in "-." and end + 1 < len(text) and _word_char(text[end + 1])
        ):
            return False
    return True


def stands_in(value: str, text: str) -> bool:
    """``value`` occurs in ``text`` as a token of its own (:func:`stands_at`) at least once:
    a value found only inside a longer name names another thing."""
    at = text.find(value)
    while at >= 0:
        if stands_at(text, at, at + len(value)):
            return True
        at = text.find(value, at + 1)
    return False


def held_in(values: Iterable[str], text: str, whole: bool = False) -> set[str]:
    """The ``values`` that occur in ``text`` as substrings (as ``value in text`` tests each;
    the caller case-folds or normalises both alike); ``whole``: as tokens of their own
    (:func:`stands_in`). One Aho-Corasick pass over ``text`` (pyahocorasick, in C) finds
    them all: a thread's facts are hundreds of values and the text they are looked for in
    tens of thousands of chars, where one ``in`` per value scans the text once per value."""
    wanted = frozenset(values)
    if len(wanted) < _AUTOMATON_MIN_VALUES or len(text) < _AUTOMATON_MIN_CHARS:
        if whole:
            return {v for v in wanted if stands_in(v, text)}
        return {v for v in wanted if v in text}
    held = {""} if "" in wanted else set()  # the empty string is in every text
    if not whole:
        held.update(map(itemgetter(1), _automaton(wanted).iter(text)))  # (end, value) per match
        return held
    for end, value in _automaton(wanted).iter(text):
        if value not in held and stands_at(text, end + 1 - len(value), end + 1):
            held.add(value)
    return held


@functools.lru_cache(maxsize=2)
def _automaton(values: frozenset[str]) -> Any:
    """The Aho-Corasick automaton of ``values`` (the empty one left out), built once for
    the texts they are looked for in (the loss report looks for a compaction's facts in
    what stays in view, then in the archive; the last two kept: about 200 KB each for a
    thousand values)."""
    automaton = ahocorasick.Automaton()
    for value in values:
        if value:
            automaton.add_word(value, value)
    automaton.make_automaton()
    return automaton


#: A shortened result's note pointing at its original: ``recall("f6d87949"``.
_CITED = re.compile(r'recall\("([^"\s]{1,80})"')


#: Cheap necessary conditions of some kinds' patterns (the scans are most of the
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
    r"(?:-[0-9A-Za-z.]+)?(?!\w|\.\w)": re.compile(r"\.\d"),
    # env: "_" then a capital or a digit
    r"[A-Z](?<![\w.-][A-Z])[A-Z0-9]*(?:_[A-Z0-9]+)+(?![\w-])": re.compile(r"_[A-Z0-9]"),
    # name: a backtick
    r"`(?=[^`\s]*[A-Za-z])([\w.:/-]{3,80}(?:\(\))?)`": re.compile(r"`"),
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


def find(text: str, skip: frozenset[str] = frozenset()) -> list[tuple[str, str, int]]:
    """The facts in ``text`` as ``(value, kind, offset)``, in order of appearance. Each char
    belongs to one fact at most: the first kind (most specific) to match it takes it.
    ``skip``: kinds not looked for (:data:`SAID_ONLY` in tool output)."""
    taken = bytearray(len(text))  # 1 where a fact already is: one C-level scan per check
    out: list[tuple[str, str, int]] = []
    for m in _CITED.finditer(text):  # offpath's own pointer to a message, not a fact of it:
        # a random id (its prefix), pinned or not by chance (all digits: a number)
        taken[m.start(1) : m.end(1)] = b"\x01" * (m.end(1) - m.start(1))
    low: str | None = None  # the lower-cased text, for the word gates (ASCII text only)
    for kind, pattern, gate, words in _gated_kinds(_KINDS):
        if kind in skip:
            continue
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
            if value in _NEVER or (
                kind in ("name", "term") and value.casefold().strip("_") in _NOT_NAMES
            ):
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
