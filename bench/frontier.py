"""Benchmark 15, the frontier probes (issue 19): after a compaction, does the summary name
what the agent is doing now, and never list finished work as still to do?

Three scripted sessions, generated from a seed (task names, objects, phrasings, how many tool
calls, whether the user says "continue" between steps all vary), 100 seeds each:

* ``switch``: task A is asked for, worked on and reported finished; task B is asked for and
  under way. Current: B. Finished: A.
* ``plan``: the agent writes a five-step plan; steps 1-3 are each started, worked on and
  reported done; step 4 is under way. Current: step 4. Finished: steps 1-3.
* ``revision``: an instruction ("run every check against the <old> cluster") given early,
  revised later ("... the <new> cluster from now on"), work going on. Current: the revised
  one. Superseded: the old one.

Each session is replayed message by message; before each assistant message (a model call)
offpath runs in process as in benchmark 14 (results over ``TOOL_RESULT_MAX_CHARS`` shortened,
a compaction end to end when over the threshold). The script goes on (more steps of the
current item) until the messages that state the current item and the finished ones (B's
request and A's "finished", the plan and step 3's "done", the revision) have all been
compacted away, then one to three more steps; the summary in the thread at the next model
call is scored. A session whose script runs out first is *invalid* (counted, not scored).

Summarizers, each behind the fact guard as ``make_summarizer`` builds them: ``offline`` (no
LLM configured) and ``stub``: ``tests/stub_llm.py`` over HTTP through ``ChatOpenAI`` (an
LLM-shaped stub: its summary's **Investigating** is the first human message of the prompt,
its findings generic, padded to 3,000 chars).

The rules (:func:`score`), applied to the summary message's text. It is cut into sections at
its headings (``**Heading:**`` or a Markdown ``#`` heading); a section is

* *current* when its heading reads as the work in progress or to come: Investigating,
  Current state, the request of the turn in progress, and any heading with current, latest,
  in progress, next, pending, open, remaining, to do, active, under way, instruction, focus,
  now, status, intent, goal or task in it (unless it reads as one of the next kind);
* *neutral* when its heading names a record, not the work: original, first request, pinned,
  findings, ruled out, since this summary, facts, artifacts, summary (and the text before the
  first heading); any other heading is neutral too, and one with done, finished, completed,
  closed or resolved is a *done* section.

Sections are cut into clauses at line ends, semicolons and sentence ends.

* **R1, names the current item**: its key phrase (B's task phrase, step 4's phrase, the new
  cluster's name; case-insensitive) is in a current section.
* **R2, no finished item as pending**: no clause of a current section holds the key phrase
  of a finished item (A's task phrase, steps 1-3's phrases, the old cluster's name) unless
  the same clause marks it done (done, finished, complete(d), resolved, fixed, closed, ✓,
  [x]) or, for the old instruction, superseded (instead of, no longer, superseded, replaced,
  revised, previously, formerly, old, earlier).
* **R3, no bare follow-up as the task**: no current section is only a follow-up like
  "continue", "proceed", "go on", "ok", "yes" (a section whose heading says it quotes a message
  verbatim is what was said, and is left out of this rule).

A probe passes when R1, R2 and R3 hold. The rules are checked on hand-written summaries
before each run (:data:`SELF_CHECK`): each bad one must fail the rule it breaks, each good
one pass; the benchmark stops if not. Target (issue 19): 100% pass with each summarizer, and
no finished item listed as pending.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bench.common import Context, Result
from bench.compacting import Archive, Messages, OffpathCompactor, is_summary_message

NAME = "frontier"
SEEDS = 100
QUICK_SEEDS = 10
#: (threshold, keep) in chars: small enough that a session compacts a few times.
THRESHOLD, KEEP = 10_000, 3_000
STUB_SUMMARY_CHARS = 3_000
MAX_STEPS = 60

# --- the rules --------------------------------------------------------------------------

_HEADING = re.compile(
    r"^\s*(?:#{1,6}\s*)?\*\*(?P<bold>[^*\n]{1,100}?)\*\*:?\s*(?P<rest>.*)$"
    r"|^\s*#{1,6}\s+(?P<md>[^\n]{1,100})$"
)
_NEUTRAL = re.compile(
    r"original|first request|pinned|findings|ruled out|since this summary|facts|artifacts"
    r"|summary",
    re.I,
)
_CURRENT = re.compile(
    r"investigat|current|in progress|latest|next|pending|open|remaining|to ?do|active"
    r"|under ?way|instruction|focus|\bnow\b|status|intent|goal|task|request",
    re.I,
)
_DONE_HEADING = re.compile(r"\b(done|finished|completed?|closed|resolved)\b", re.I)
_DONE = re.compile(r"\b(done|finished|complete|completed|resolved|fixed|closed)\b|✓|✅|\[x\]", re.I)
_SUPERSEDED = re.compile(
    r"\b(instead of|no longer|superseded|replaced|revised|previously|formerly|old|earlier)\b",
    re.I,
)
_FOLLOW_UP = re.compile(
    r"^(please )?(continue|proceed|go on|go ahead|carry on|keep going|ok(ay)?|yes|sure|next)"
    r"(,? (please|continue|go on|keep going))?$",
    re.I,
)
_CLAUSE = re.compile(r"\n|;|(?<=[.!?])\s+")


def sections(text: str) -> list[tuple[str, str, str]]:
    """``(kind, heading, body)`` of each section of a summary's text, in order; kind is
    ``current``, ``done`` or ``neutral`` (see the module doc)."""
    out: list[tuple[str, str, list[str]]] = [("neutral", "", [])]
    for line in text.splitlines():
        m = _HEADING.match(line)
        if m and not line.lstrip().startswith(("-", "*  ")):
            heading = (m.group("bold") or m.group("md") or "").strip().rstrip(":").strip()
            if _NEUTRAL.search(heading):
                kind = "neutral"
            elif _CURRENT.search(heading):
                kind = "current"
            elif _DONE_HEADING.search(heading):
                kind = "done"
            else:
                kind = "neutral"
            out.append((kind, heading, [m.group("rest") or ""]))
        else:
            out[-1][2].append(line)
    return [(k, h, "\n".join(b).strip()) for k, h, b in out]


@dataclass
class Verdict:
    r1: bool
    r2: bool
    r3: bool
    why: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.r1 and self.r2 and self.r3


def score(text: str, current: str, finished: list[str], superseded: bool = False) -> Verdict:
    """The rules R1-R3 (module doc) on a summary's ``text``: ``current`` is the current
    item's key phrase, ``finished`` those of the finished (or, ``superseded``, replaced)
    items."""
    why = []
    parts = sections(text)
    now = [(h, b) for k, h, b in parts if k == "current"]
    r1 = any(current.lower() in f"{b}".lower() for _, b in now)
    if not r1:
        why.append(f"R1: {current!r} in no current section")
    mark = _SUPERSEDED if superseded else _DONE
    r2 = True
    for heading, body in now:
        for clause in _CLAUSE.split(body):
            low = clause.lower()
            for item in finished:  # as a phrase of its own ("cordon" is not in "uncordon")
                named = re.search(rf"(?<!\w){re.escape(item.lower())}(?!\w)", low)
                if named and not (mark.search(clause) or _DONE.search(clause)):
                    r2 = False
                    why.append(f"R2: {item!r} under {heading!r}: {clause.strip()[:100]!r}")
    r3 = True
    for heading, body in now:
        if "verbatim" in heading.lower():  # a quote of what was said: accurate by construction
            continue
        plain = re.sub(r"[*_`>#\-]", "", body).strip().rstrip(".!").strip()
        if _FOLLOW_UP.match(plain):
            r3 = False
            why.append(f"R3: {heading!r} is only {plain!r}")
    return Verdict(r1, r2, r3, why)


#: Hand-written summaries the rules must judge as stated: (label, text, current, finished,
#: superseded, the rules it must fail: "" when it must pass).
SELF_CHECK: tuple[tuple[str, str, str, list[str], bool, str], ...] = (
    (
        "good: B current, A done",
        "**Investigating:** raise the memory limit of billing-worker-7\n**Key findings:**\n"
        "- the TLS certificate of ingress-gw-3 was rotated\n**Ruled out:** nothing\n"
        "**Current state:** the TLS certificate of ingress-gw-3 is done; working on the "
        "memory limit of billing-worker-7.",
        "the memory limit of billing-worker-7",
        ["the TLS certificate of ingress-gw-3"],
        False,
        "",
    ),
    (
        "bad: A still investigated, B nowhere current",
        "**Investigating:** Please rotate the TLS certificate of ingress-gw-3.\n"
        "**Key findings:**\n- the memory limit of billing-worker-7 is 1Gi\n**Ruled out:** none\n"
        "**Current state:** stub summary",
        "the memory limit of billing-worker-7",
        ["the TLS certificate of ingress-gw-3"],
        False,
        "R1 R2",
    ),
    (
        "bad: a bare continue as the investigation",
        "**Investigating:** continue\n**Key findings:**\n- none\n**Ruled out:** none\n"
        "**Current state:** checking the memory limit of billing-worker-7.",
        "the memory limit of billing-worker-7",
        ["the TLS certificate of ingress-gw-3"],
        False,
        "R3",
    ),
    (
        "bad: the plan quoted as what is next",
        "**Investigating:** upgrade pool-a\n**Key findings:**\n- none\n**Ruled out:** none\n"
        "**Current state:** Plan: 1. cordon the nodes of pool-a 2. drain the workloads of "
        "pool-a 3. snapshot the etcd data of pool-a 4. upgrade the kubelet of pool-a",
        "upgrade the kubelet of pool-a",
        [
            "cordon the nodes of pool-a",
            "drain the workloads of pool-a",
            "snapshot the etcd data of pool-a",
        ],
        False,
        "R2",
    ),
    (
        "bad: finished steps listed under Pending",
        "**Investigating:** upgrade pool-a\n**Key findings:**\n- none\n**Ruled out:** none\n"
        "**Current state:** upgrade the kubelet of pool-a\n**Pending:**\n"
        "- drain the workloads of pool-a\n- upgrade the kubelet of pool-a",
        "upgrade the kubelet of pool-a",
        ["drain the workloads of pool-a"],
        False,
        "R2",
    ),
    (
        "good: steps under Done, step 4 under Next",
        "**Investigating:** upgrade pool-a\n**Done:**\n- cordon the nodes of pool-a\n"
        "- drain the workloads of pool-a\n**Next:** upgrade the kubelet of pool-a\n"
        "**Key findings:**\n- none\n**Ruled out:** none\n**Current state:** step 4",
        "upgrade the kubelet of pool-a",
        ["cordon the nodes of pool-a", "drain the workloads of pool-a"],
        False,
        "",
    ),
    (
        "bad: the old instruction as current",
        "**Investigating:** latency of search-api-2; run every check against the eu-west-2 "
        "cluster\n**Key findings:**\n- none\n**Ruled out:** none\n**Current state:** checks "
        "running",
        "us-east-1",
        ["eu-west-2"],
        True,
        "R1 R2",
    ),
    (
        "good: the revised instruction current, the old one superseded",
        "**Investigating:** latency of search-api-2\n**Key findings:**\n- none\n"
        "**Ruled out:** none\n**Current state:** checks run against us-east-1 (instead of "
        "eu-west-2).",
        "us-east-1",
        ["eu-west-2"],
        True,
        "",
    ),
)


def self_check() -> list[str]:
    """Each :data:`SELF_CHECK` summary judged as stated; raises AssertionError if not."""
    out = []
    for label, text, current, finished, sup, must_fail in SELF_CHECK:
        v = score(text, current, finished, sup)
        failed = " ".join(r for r, ok in (("R1", v.r1), ("R2", v.r2), ("R3", v.r3)) if not ok)
        if failed != must_fail:
            raise AssertionError(f"rule self-check {label!r}: failed {failed!r}, not {must_fail!r}")
        out.append(f"{label}: {'fails ' + failed if failed else 'passes'}")
    return out


# --- the sessions -----------------------------------------------------------------------

#: (key phrase with {o}, object name pattern, request templates, finished statement)
TASKS = (
    (
        "the TLS certificate of {o}",
        "ingress-gw-{n}",
        ("Please rotate {key}; it expires in two days.", "Rotate {key} today, please."),
        "Finished: {key} is rotated and the new one is served.",
    ),
    (
        "the memory limit of {o}",
        "billing-worker-{n}",
        ("Raise {key} to 2Gi; its pods keep getting OOM-killed.", "Can you raise {key}?"),
        "Finished: {key} is now 2Gi and the pods are stable.",
    ),
    (
        "the nightly backup of {o}",
        "orders-db-{n}",
        ("Find out why {key} failed last night and get it green again.", "Fix {key}."),
        "Finished: {key} ran again and completed.",
    ),
    (
        "the orphaned volumes of {o}",
        "team-ns-{n}",
        ("Clean up {key}; we are near the storage quota.", "Please delete {key}."),
        "Finished: {key} are deleted and 120Gi is free again.",
    ),
    (
        "the 502 errors of {o}",
        "checkout-api-{n}",
        ("Investigate {key} that started after the last deploy.", "Look into {key}."),
        "Finished: {key} came from a bad upstream timeout, now fixed.",
    ),
    (
        "the DNS record of {o}",
        "status-page-{n}",
        ("Restore {key}; the page is unreachable.", "Please bring back {key}."),
        "Finished: {key} is restored and resolves again.",
    ),
    (
        "the disk usage of {o}",
        "logs-node-{n}",
        ("Bring down {key}; it is at 95%.", "Reduce {key} please."),
        "Finished: {key} is down to 60%.",
    ),
)
NEXT_TASK = (
    "Thanks. Next task: {request}",
    "Good, that one is finished. Now: {request}",
    "{request}",
    "Great. New request: {request}",
)
STEPS = (
    "cordon the nodes of {p}",
    "drain the workloads of {p}",
    "snapshot the etcd data of {p}",
    "upgrade the kubelet of {p}",
    "rotate the node certificates of {p}",
    "uncordon the nodes of {p}",
    "run the smoke tests of {p}",
    "resize the autoscaler of {p}",
)
STEP_START = ("Step {k}: {s}.", "Now step {k}: {s}.", "Moving on to step {k}: {s}.")
STEP_DONE = ("Step {k} done: {s}.", "✓ Step {k} ({s}) is complete.", "Completed step {k}: {s}.")
STEP4_START = ("Step 4 under way: {s}.", "Starting step 4: {s}.", "Now step 4: {s}.")
CLUSTERS = ("eu-west-2", "us-east-1", "ap-south-1", "eu-central-1", "us-west-2", "ca-central-1")
INSTRUCTION = (
    "Run every check against the {c} cluster.",
    "Use the {c} cluster for all checks.",
    "All checks go to the {c} cluster, please.",
)
REVISION = (
    "Change of plan: run all remaining checks against the {c} cluster.",
    "Correction: use the {c} cluster from now on.",
    "Update: the checks must target the {c} cluster for the rest of this.",
)
FOLLOW_UPS = ("continue", "proceed", "go on", "ok, keep going", "yes, continue")
THOUGHTS = (
    "Checking the current state.",
    "Looking at the recent events.",
    "Reading the logs around the alert.",
    "Comparing with the baseline.",
    "Querying the metrics for the last hour.",
    "",
)
TOOLS = ("kubectl", "get_logs", "query_metrics", "run_check")
INTERIM = (
    "Interim update: {n} checks done so far, nothing conclusive yet. Shall I continue?",
    "So far {n} checks are done. I will carry on unless you stop me.",
)


@dataclass
class Probe:
    """What a session is scored on."""

    kind: str
    current: str
    finished: list[str]
    superseded: bool = False
    #: ids of the messages that must be compacted away before the summary is scored
    gone: list[str] = field(default_factory=list)
    #: the current item's request, word for word (the issue wants it kept verbatim)
    request: str = ""


class Script(Messages):
    """A session's messages, generated from a seed; ``Probe`` filled as it goes."""

    def __init__(self, kind: str, seed: int) -> None:
        super().__init__(random.Random(f"{kind}-{seed}"), f"{kind[:3]}{seed}")
        self.probe = Probe(kind, "", [])

    def step(self, subject: str) -> list[Any]:
        """One tool call and its result about ``subject`` (an object name, never a key
        phrase): 500-1,300 chars of output with numbers, times and names."""
        rng = self.rng
        tool = rng.choice(TOOLS)
        args = {"target": subject, "window": f"{rng.randint(5, 90)}m"}
        lines = []
        for _ in range(rng.randint(6, 16)):
            lines.append(
                f"2025-03-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
                f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z {subject}-"
                f"{rng.randrange(16**5):05x} {rng.choice(('INFO', 'WARN', 'ERROR'))} "
                f"{rng.choice(('latency_ms', 'restarts', 'cpu_m', 'mem_mi', 'queue'))}="
                f"{rng.randint(1, 4000)} "
                f"{rng.choice(('probe ok', 'request slow', 'retrying upstream', 'gc pause'))}"
            )
        return self.call(tool, args, "\n".join(lines), rng.choice(THOUGHTS))

    def work(self, subject: str, follow_ups: bool) -> Iterator[Any]:
        """Steps about ``subject`` without end; with ``follow_ups`` the agent stops now and
        then with an interim note and the user says "continue". A ``None`` marks a point
        where the script may stop."""
        rng = self.rng
        n = 0
        while True:
            yield from self.step(subject)
            n += 1
            if follow_ups and rng.random() < 0.3:
                yield self.ai(rng.choice(INTERIM).format(n=n))
                yield self.human(rng.choice(FOLLOW_UPS))
            yield None


def switch(s: Script) -> Iterator[Any]:
    rng = s.rng
    a, b = rng.sample(TASKS, 2)
    oa, ob = (t[1].format(n=rng.randint(1, 9)) for t in (a, b))
    key_a, key_b = a[0].format(o=oa), b[0].format(o=ob)
    s.probe.current, s.probe.finished = key_b, [key_a]
    yield s.human(rng.choice(a[2]).format(key=key_a))
    for _ in range(rng.randint(2, 14)):
        yield from s.step(oa)
    done = s.ai(a[3].format(key=key_a))
    yield done
    request = rng.choice(b[2]).format(key=key_b)
    ask = s.human(rng.choice(NEXT_TASK).format(request=request))
    s.probe.request = request
    s.probe.gone = [str(done.id), str(ask.id)]
    yield from asked(s, ask, f"Starting on {key_b}.", ob)


def plan(s: Script) -> Iterator[Any]:
    rng = s.rng
    pool = f"pool-{rng.choice('abcdefgh')}{rng.randint(1, 9)}"
    steps = [x.format(p=pool) for x in rng.sample(STEPS, 5)]
    s.probe.current, s.probe.finished = steps[3], steps[:3]
    yield s.human(
        rng.choice(
            (
                f"Upgrade the node pool {pool} to Kubernetes 1.{rng.randint(28, 31)}. "
                "Work through it step by step.",
                f"Please do the {pool} upgrade; make a plan first.",
            )
        )
    )
    the_plan = s.ai("Plan:\n" + "\n".join(f"{k}. {x}" for k, x in enumerate(steps, 1)))
    yield the_plan
    follow_ups = rng.random() < 0.5
    last_done = None
    for k in range(3):
        yield s.ai(rng.choice(STEP_START).format(k=k + 1, s=steps[k]))
        for _ in range(rng.randint(1, 5)):
            yield from s.step(pool)
        last_done = s.ai(rng.choice(STEP_DONE).format(k=k + 1, s=steps[k]))
        yield last_done
        if follow_ups:
            yield s.human(rng.choice(FOLLOW_UPS))
    assert last_done is not None
    s.probe.gone = [str(the_plan.id), str(last_done.id)]
    yield s.ai(rng.choice(STEP4_START).format(s=steps[3]))
    yield from s.work(pool, follow_ups=False)


def revision(s: Script) -> Iterator[Any]:
    rng = s.rng
    old, new = rng.sample(CLUSTERS, 2)
    svc = f"search-api-{rng.randint(1, 9)}"
    s.probe.current, s.probe.finished, s.probe.superseded = new, [old], True
    task = f"Investigate the latency alerts of {svc}."
    rule = rng.choice(INSTRUCTION).format(c=old)
    if rng.random() < 0.5:
        first = s.human(f"{task} {rule}")
        yield first
    else:
        first = s.human(task)
        yield first
        yield s.ai("On it.")
        yield s.human(rule)
    if rng.random() < 0.5:
        yield s.ai(f"Running the first checks on the {old} cluster.")
    for _ in range(rng.randint(2, 12)):
        yield from s.step(svc)
    yield s.ai(f"First results for {svc} are in.")
    text = rng.choice(REVISION).format(c=new)
    revised = s.human(text)
    s.probe.request = text
    s.probe.gone = [str(first.id), str(revised.id)]
    yield from asked(s, revised, f"Switching all checks to the {new} cluster.", svc)


def asked(s: Script, request: Any, ack: str, subject: str) -> Iterator[Any]:
    """``request`` (the current item), the agent's ``ack`` of it half the time, then work on
    ``subject`` with or without "continue" turns."""
    yield request
    if s.rng.random() < 0.5:
        yield s.ai(ack)
    yield from s.work(subject, follow_ups=s.rng.random() < 0.6)


PROBES = {"switch": switch, "plan": plan, "revision": revision}


@dataclass
class Outcome:
    valid: bool
    verdict: Verdict | None = None
    compactions: int = 0
    boundary: str = ""
    verbatim: bool = False
    summary: str = ""


def play(kind: str, seed: int, settings: Any, summarizer: Any, archive: Archive) -> Outcome:
    """Replay one seeded session of ``kind`` through offpath (see the module doc); score the
    summary once the script's key messages are compacted away."""
    from langgraph.graph.message import add_messages

    script = Script(kind, seed)
    compactor = OffpathCompactor(settings, summarizer, archive)
    session = f"{kind}-{seed}-{summarizer.name}"
    thread: list[Any] = []
    compactions, boundary = 0, ""
    extra = script.rng.randint(1, 3)
    steps = 0
    ready = False
    for m in PROBES[kind](script):
        if m is None:  # a point where the script may stop
            steps += 1
            if ready:
                extra -= 1
            if ready and extra <= 0 or steps > MAX_STEPS:
                break
            continue
        if m.type == "ai" and thread:
            thread, done = compactor.before_model(session, thread)
            if done is not None:
                compactions += 1
                boundary = done.plan.boundary
        thread = add_messages(thread, [m])
        gone = script.probe.gone
        if gone and not ready:
            present = {str(x.id) for x in thread if not is_summary_message(x)}
            ready = str(m.id) not in gone and not any(i in present for i in gone)
    thread, done = compactor.before_model(session, thread)  # the next model call
    if done is not None:
        compactions += 1
        boundary = done.plan.boundary
    present = {str(x.id) for x in thread if not is_summary_message(x)}
    summaries = [x for x in thread if is_summary_message(x)]
    if any(i in present for i in script.probe.gone) or not summaries:
        return Outcome(False, compactions=compactions)
    from offpath.compaction.prompt import render_content

    text = render_content(summaries[0].content)
    p = script.probe
    verdict = score(text, p.current, p.finished, p.superseded)
    verbatim = bool(p.request) and p.request in text
    return Outcome(True, verdict, compactions, boundary, verbatim, text)


def run(ctx: Context | None = None) -> Result:
    from stub_llm import StubServer

    from offpath.config import load_settings
    from offpath.llm import make_summarizer

    checks = self_check()
    seeds = QUICK_SEEDS if ctx is not None and ctx.quick else SEEDS
    stub = StubServer().start()
    stub.state.summary_chars = STUB_SUMMARY_CHARS
    archive = Archive()
    results: dict[tuple[str, str], list[Outcome]] = {}
    try:
        offline = load_settings(
            summarization_threshold_chars=THRESHOLD, summarization_keep_chars=KEEP
        )
        llm = load_settings(
            summarization_threshold_chars=THRESHOLD,
            summarization_keep_chars=KEEP,
            openai_base_url=stub.base_url,
            openai_api_key="bench",
            summarization_max_retries=0,
        )
        for label, settings in (("offline", offline), ("stub", llm)):
            summarizer = make_summarizer(settings)
            for kind in PROBES:
                outs = [play(kind, seed, settings, summarizer, archive) for seed in range(seeds)]
                results[(kind, label)] = outs
                ok = sum(o.valid and o.verdict is not None and o.verdict.passed for o in outs)
                print(f"bench: {NAME}: {kind}, {label}: {ok}/{len(outs)} pass", flush=True)
    finally:
        archive.close()
        stub.shutdown()
        stub.server_close()
    return report(results, checks, seeds)


def report(results: dict[tuple[str, str], list[Outcome]], checks: list[str], seeds: int) -> Result:
    table = [
        "| probe | summarizer | valid | pass | R1 names the current item | R2 finished as "
        "pending | R3 bare follow-up | request verbatim | compactions (mean) | last cut "
        "(turn / tool group) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    totals: Counter[str] = Counter()
    measured = []
    examples = []
    for (kind, label), outs in results.items():
        valid = [o for o in outs if o.valid and o.verdict is not None]
        n = len(valid)
        passed = sum(o.verdict.passed for o in valid if o.verdict)
        r1 = sum(o.verdict.r1 for o in valid if o.verdict)
        r2_bad = sum(not o.verdict.r2 for o in valid if o.verdict)
        r3_bad = sum(not o.verdict.r3 for o in valid if o.verdict)
        verbatim = sum(o.verbatim for o in valid)
        cuts = Counter(o.boundary for o in valid)
        mean = sum(o.compactions for o in valid) / n if n else 0.0
        totals["valid"] += n
        totals["all"] += len(outs)
        totals["passed"] += passed
        totals["pending"] += r2_bad
        share = passed / n if n else 0.0
        req = f"{verbatim}/{n}" if kind != "plan" else "-"
        table.append(
            f"| {kind} | {label} | {n}/{len(outs)} | {passed}/{n} ({share:.0%}) | {r1}/{n} | "
            f"{r2_bad} | {r3_bad} | {req} | {mean:.1f} | {cuts['turn']} / {cuts['tool_group']} |"
        )
        measured.append(f"{kind} {label} {share:.0%}")
        bad = next((o for o in valid if o.verdict and not o.verdict.passed), None)
        if bad is not None and bad.verdict is not None:
            examples.append(f"{kind}, {label}, a failing summary: {'; '.join(bad.verdict.why[:3])}")
    met = totals["valid"] == totals["all"] and totals["passed"] == totals["valid"]
    return Result(
        "15. Frontier probes",
        "the summary names the current item (task B, step 4, the revised instruction) in 100% "
        "of the probes with each summarizer, and never lists a finished item as pending",
        ", ".join(measured)
        + f"; finished items listed as pending in {totals['pending']} of {totals['valid']}",
        met,
        [
            f"{seeds} seeded sessions per probe (switch: task A finished, task B under way; "
            "plan: steps 1-3 done, step 4 under way; revision: an instruction given early and "
            "revised later), replayed through offpath in process (benchmark 14's compactor) at "
            f"threshold {THRESHOLD:,} / keep {KEEP:,} chars; scored once the messages stating "
            "the current and the finished items are compacted away (valid: that happened "
            f"within {MAX_STEPS} steps)",
            "offline: the offline summarizer behind the fact guard; stub: tests/stub_llm.py "
            f"over HTTP through ChatOpenAI, summaries padded to {STUB_SUMMARY_CHARS:,} chars "
            "(its Investigating is the first human message of the prompt), behind the fact guard "
            "(make_summarizer)",
            "rules (bench/frontier.py): sections by heading; current = Investigating, Current "
            "state, the request of the turn in progress, or a heading with current / latest / "
            "next / pending / open / to do / instruction / status / task ...; neutral = "
            "original, pinned, findings, ruled out, since this summary, facts; R1: the current "
            "item's key phrase in a current section; R2: a finished item's key phrase in a "
            "clause of a current section only with a done (or, for the old instruction, "
            "superseded) mark in that clause; R3: no current section that is only "
            "'continue' / 'proceed' / 'ok'...",
            "rule self-check on hand-written summaries: " + "; ".join(checks),
            *examples,
        ],
        "",
        table,
    )
