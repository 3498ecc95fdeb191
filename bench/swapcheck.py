"""Benchmark 16, the check before the swap (issue 19): a compaction is prepared, messages
arrive while its summary is written, one of them refers to an identifier that only the part
being removed holds; once the compaction is applied, can the model still see it?

Each run (seeded) builds a thread at offpath's default settings: a request, then tool calls
whose results list records (orders ``#W1234567``, pods ``api-7f9c4d-x2k9q``, reservations
``K4Q7ZD``; each with a status, an amount and a time of its own) and the agent's remarks on a
few of them, up to the prepare point (``SUMMARIZATION_PREPARE_AT`` x the threshold, plus up
to 5,000 chars). Then, as the worker does:

1. plan (``plan_compaction(..., early=True)``), prompt, summarize, ``Prepared.from_plan``;
2. pick an identifier X that is in a removed message and in neither the summary's text nor a
   kept message (the run is invalid when there is none);
3. append what arrived "while the summary was written": filler tool calls (no record of the
   removed part) until the thread is over its threshold by 0-25%, and, at a random place among
   them, one message that refers to X: a user's question, a tool call with X as its argument
   (and a result that adds nothing about it), or an agent's remark;
4. apply: ``fit_now(prepared, thread_now, settings)``, the fit every apply of the product
   calls (``Jobs.apply``). When it returns ``Stale`` the compaction is
   re-prepared on the thread as it is now (plan, summarize, fit again) and counted.

Measured on the thread after the swap:

* **visible**: X is in a kept message that was there when the compaction was planned, or on a
  line of the summary that does not come from the messages that arrived since (a line citing
  a removed message's id counts; a line citing one of the arrived messages' ids, or quoting
  their text, does not): what the model reads about X beyond the reference itself;
* **with its record**: that line also carries X's record (its status and amount);
* **re-prepared**: runs whose prepared compaction ``fit`` found stale (every one of them was
  valid: only messages were appended).

A control set (same seeds, the reference pointing to an identifier found nowhere) gives the
re-prepared share when there is nothing to rescue. Summarizers: ``offline`` and ``stub`` (the
LLM-shaped stub that names nothing of benchmark 14), each behind the fact guard. Targets
(issue 19): visible in >= 99% of the runs, <= 5% re-prepared.
"""

from __future__ import annotations

import dataclasses
import random
import re
import string
from dataclasses import dataclass, field
from typing import Any

from bench.common import Context, Result
from bench.compacting import Messages, is_summary_message, stub_summarizer, text_of

NAME = "swapcheck"
RUNS = 500
QUICK_RUNS = 40
VISIBLE_TARGET = 0.99
REPREPARED_TARGET = 0.05
DOMAINS = ("orders", "pods", "reservations")
STATUSES = ("pending", "shipped", "failed", "refunded", "delivered", "held")


@dataclass
class Record:
    ident: str
    detail: str  # what the removed part says of it, beyond its id

    def line(self) -> str:
        return f"{self.ident} {self.detail}"


def records(rng: random.Random, domain: str, n: int) -> list[Record]:
    """``n`` records of ``domain`` with ids and details of their own."""
    out = []
    for _ in range(n):
        if domain == "orders":
            ident = f"#W{rng.randrange(10**6, 10**7)}"
        elif domain == "pods":
            svc = rng.choice(("api", "checkout", "billing", "search", "auth", "cart"))
            alnum = string.ascii_lowercase + string.digits
            ident = f"{svc}-{rng.randrange(16**6):06x}-{''.join(rng.choices(alnum, k=5))}"
        else:
            ident = "".join(rng.choices(string.ascii_uppercase + string.digits, k=6))
        detail = (
            f"status={rng.choice(STATUSES)} amount={rng.randint(10, 9999)}.{rng.randint(0, 99):02d} "
            f"at=2025-04-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
        )
        out.append(Record(ident, detail))
    return out


@dataclass
class Run:
    valid: bool = False
    visible: bool = False
    with_record: bool = False
    reprepared: bool = False
    applied: bool = False
    folded: bool = False  # the swap also removed messages that arrived (its since-section)
    reason: str = ""


@dataclass
class Tally:
    runs: list[Run] = field(default_factory=list)

    def count(self, attr: str) -> int:
        return sum(getattr(r, attr) for r in self.runs if r.valid)

    @property
    def valid(self) -> int:
        return sum(r.valid for r in self.runs)


class Builder(Messages):
    """Messages with ids of one run."""

    def filler(self, chars: int) -> list[Any]:
        """A tool call whose result (about ``chars`` chars) names no record."""
        rng = self.rng
        lines, size = [], 0
        while size < chars:
            line = (
                f"2025-04-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}Z "
                f"worker queue depth {rng.randint(0, 500)}, p95 {rng.randint(5, 900)} ms, "
                f"{rng.choice(('ok', 'slow', 'retry', 'ok'))}"
            )
            lines.append(line)
            size += len(line) + 1
        return self.call("query_metrics", {"window": f"{rng.randint(5, 60)}m"}, "\n".join(lines))


def build(
    rng: random.Random, prefix: str, settings: Any
) -> tuple[list[Any], list[Record], Builder]:
    """A thread up to the prepare point (see the module doc), and its records."""
    from offpath.compaction.accounting import total_chars

    b = Builder(rng, prefix)
    domain = rng.choice(DOMAINS)
    thread: list[Any] = [
        b.human(
            rng.choice(
                (
                    f"Audit the {domain} touched by yesterday's incident and list what is still wrong.",
                    f"Go through the {domain} of the last batch; find the broken ones.",
                )
            )
        )
    ]
    all_records: list[Record] = []
    goal = settings.prepare_floor_chars + rng.randint(0, 5_000)
    limit = settings.tool_result_limit_chars
    page = 0
    while total_chars(thread) < goal:
        if rng.random() < 0.65:
            rows = records(rng, domain, rng.randint(20, 90))
            result = "\n".join(r.line() for r in rows)[: limit - 100]
            rows = [r for r in rows if r.line() in result]
            all_records += rows
            page += 1
            thread += b.call(f"list_{domain}", {"page": page}, result, "Listing the next page.")
            if rng.random() < 0.5 and rows:
                picked = rng.sample(rows, min(len(rows), rng.randint(1, 3)))
                thread.append(
                    b.ai(
                        "Noted: "
                        + "; ".join(f"{r.ident} is {r.detail.split()[0][7:]}" for r in picked)
                        + "."
                    )
                )
        else:
            thread += b.filler(rng.randint(400, 3_000))
    threshold = settings.summarization_threshold_chars
    while total_chars(thread) > threshold - 1_000:  # prepared ahead: under the threshold
        thread = thread[:-2] if thread[-1].type == "tool" else thread[:-1]
    return thread, all_records, b


def one(seed: int, settings: Any, summarizer: Any, probe: Any = None) -> tuple[Run, Run]:
    """One seeded run (see the module doc), and its control (the reference to an unknown id),
    on the same prepared compaction. ``probe(record, plan, arrived)``: a line added to the
    prepared summary (the rule's self-check)."""
    from offpath.compaction.patch import Prepared
    from offpath.compaction.planner import Skip, plan_compaction
    from offpath.compaction.prompt import build_prompt

    rng = random.Random(f"swap-{seed}")
    thread, recs, _ = build(rng, f"s{seed}", settings)

    def prepare(messages: list[Any]) -> Any:
        plan = plan_compaction(messages, settings, early=True)
        if isinstance(plan, Skip):
            return None, None
        result = summarizer.summarize(
            plan, build_prompt(plan, settings.summarization_max_prompt_chars)
        )
        prepared = Prepared.from_plan(
            plan, job_id=f"job-{seed}", summary_text=result.text, summarizer=summarizer.name,
            model=result.model,
        )  # fmt: skip
        return plan, prepared

    plan, prepared = prepare(thread)
    if plan is None:
        invalid = Run(reason="no plan at the prepare point")
        return invalid, invalid
    removed = set(_TOKEN.findall("\n".join(text_of(m) for m in plan.removed)))
    elsewhere = set(_TOKEN.findall("\n".join(text_of(m) for m in plan.kept)))
    elsewhere |= set(_TOKEN.findall(prepared.summary_text))
    candidates = [r for r in recs if r.ident in removed and r.ident not in elsewhere]
    if not candidates:
        invalid = Run(reason="every record of the removed part is in the summary or kept")
        return invalid, invalid
    rec = rng.choice(candidates)
    if probe is not None:  # the rule's self-check: a summary that does, or does not, show rec
        line = probe(rec, plan, arrivals(seed, rec.ident, thread, settings))
        prepared = dataclasses.replace(prepared, summary_text=f"{prepared.summary_text}\n{line}")
    return (
        apply(seed, settings, thread, plan, prepared, prepare, rec, rec.ident),
        apply(seed, settings, thread, plan, prepared, prepare, rec, UNKNOWN),
    )


#: What the control runs refer to: an id of the records' shape that no record has.
UNKNOWN = "#W0000000"
_TOKEN = re.compile(r"[#\w-]+")


def arrivals(seed: int, x: str, thread: list[Any], settings: Any) -> list[Any]:
    """What arrives while the summary is written: filler, and one message referring to ``x``,
    until the thread is 0-25% over its threshold (the same for any ``x`` of a seed)."""
    from offpath.compaction.accounting import total_chars

    rng = random.Random(f"arrive-{seed}")
    b = Builder(rng, f"s{seed}-new")
    ref: list[Any]
    how = rng.choice(("human", "call", "remark"))
    if how == "human":
        ref = [b.human(rng.choice((f"What was the status of {x}?", f"Can you re-check {x}?")))]
    elif how == "call":
        ref = b.call("lookup", {"id": x}, f"lookup {x}: the service timed out, try again later.")
    else:
        ref = [b.ai(f"I will come back to {x} once this page is done.")]
    threshold = settings.summarization_threshold_chars
    over = threshold + int(threshold * rng.uniform(0, 0.25))
    base = total_chars(thread)
    arrived: list[Any] = []
    placed = False
    while not placed or base + total_chars(arrived) <= over:
        if not placed and (rng.random() < 0.4 or base + total_chars(arrived) > threshold):
            arrived += ref
            placed = True
        else:
            arrived += b.filler(rng.randint(400, 4_000))
    return arrived


def apply(
    seed: int,
    settings: Any,
    thread: list[Any],
    plan: Any,
    prepared: Any,
    prepare: Any,
    rec: Record,
    x: str,
) -> Run:
    """Append what arrived (referring to ``x``), apply ``prepared`` as ``Jobs.apply`` does
    (re-prepared once when stale), and say what the model can see of ``rec``."""
    from langgraph.graph.message import add_messages

    from offpath.compaction.patch import Stale, fit_now

    arrived = arrivals(seed, x, thread, settings)
    now = add_messages(thread, arrived)
    fitted = fit_now(prepared, now, settings)
    run = Run(valid=True)
    if isinstance(fitted, Stale):
        run.reprepared = True
        _, again = prepare(now)
        fitted = fit_now(again, now, settings) if again is not None else Stale("no plan")
        if isinstance(fitted, Stale):
            run.reason = f"not applied: {fitted.reason}"
            return run
    run.applied = True
    run.folded = bool(fitted.record.get("since_summary"))
    after = add_messages(now, fitted.patch)
    run.visible, run.with_record = seen(after, plan, arrived, rec)
    return run


def seen(after: list[Any], plan: Any, arrived: list[Any], rec: Record) -> tuple[bool, bool]:
    """Whether the model reads ``rec``'s id (and its record) in ``after`` beyond the messages
    that arrived since the plan: in a message the plan saw and kept, or on a summary line
    that cites a removed message, or that neither cites one of the arrived messages nor
    quotes their text."""
    from offpath.compaction.prompt import render_content
    from offpath.compaction.summary import cite

    planned = {str(m.id) for m in plan.kept}
    # a summary cites a UUID by its first hex chars: either form is a citation
    removed_ids = {i for m in plan.removed for i in (str(m.id), cite(str(m.id)))}
    new_ids = {i for m in arrived for i in (str(m.id), cite(str(m.id)))}
    new_text = "\n".join(text_of(m) for m in arrived)
    lines: list[str] = []
    for m in after:
        if is_summary_message(m):
            for line in render_content(m.content).splitlines():
                cited = set(_TOKEN.findall(line))
                if not cited & removed_ids and (cited & new_ids or _quotes(line, new_text)):
                    continue
                lines.append(line)
        elif str(m.id) in planned:
            lines += text_of(m).splitlines()
    hit = [line for line in lines if rec.ident in line]
    detail = rec.detail.split()[1]  # amount=...: a value of the record alone
    return bool(hit), any(detail in line for line in hit)


_QUOTED = re.compile(r"`([^`]+)`")


def _quotes(line: str, text: str) -> bool:
    """The summary ``line`` quotes ``text`` (a clipped quote's pieces all found in it)."""
    parts = _QUOTED.findall(line) or [line.strip().lstrip("-* ").strip()]
    pieces = [p for q in parts for p in q.split("...") if len(p.strip()) >= 8]
    return bool(pieces) and all(p.strip() in text for p in pieces)


def self_check(settings: Any, summarizer: Any) -> list[str]:
    """The visibility rule judged on summaries made to pass or fail it (raises
    AssertionError if it judges one wrongly): a pinned line quoting X's record from the
    removed message shows X with its record; a line quoting the message that arrived (as the
    since-section would) does not, nor does one citing that message's id."""

    def pinned(rec: Record, plan: Any, arrived: list[Any]) -> str:
        source = next(m for m in plan.removed if rec.ident in text_of(m))
        return f"- `{rec.line()}` ({source.id})"

    def quoted(rec: Record, plan: Any, arrived: list[Any]) -> str:
        source = next(m for m in arrived if rec.ident in text_of(m))
        return f"- `{next(ln for ln in text_of(source).splitlines() if rec.ident in ln)}`"

    def cited(rec: Record, plan: Any, arrived: list[Any]) -> str:
        source = next(m for m in arrived if rec.ident in text_of(m))
        return f"- also in {source.id}: `{rec.ident}`"

    def both(rec: Record, plan: Any, arrived: list[Any]) -> str:
        new = next(m for m in arrived if rec.ident in text_of(m))
        return f"{pinned(rec, plan, arrived)}, referred to by {new.id}"

    out = []
    for name, probe, expected in (
        ("a pinned line of the removed record", pinned, (True, True)),
        ("the same line naming the message that referred to it", both, (True, True)),
        ("a quote of the message that arrived", quoted, (False, False)),
        ("a line citing the message that arrived", cited, (False, False)),
    ):
        seed = 0
        while not (r := one(seed, settings, summarizer, probe)[0]).applied:
            seed += 1
        got = (r.visible, r.with_record)
        if got != expected:
            raise AssertionError(f"visibility self-check {name!r}: {got}, not {expected}")
        out.append(f"{name}: {'visible' if got[0] else 'not visible'}")
    return out


def run(ctx: Context | None = None) -> Result:
    from offpath.compaction.summary import text_cap
    from offpath.config import load_settings
    from offpath.llm import make_summarizer

    n = QUICK_RUNS if ctx is not None and ctx.quick else RUNS
    settings = load_settings()
    stub_chars = text_cap(settings.summary_budget_chars) or 0
    summarizers = {
        "offline": make_summarizer(settings),
        "stub": stub_summarizer(settings, stub_chars),
    }
    checks = self_check(settings, summarizers["offline"])
    tallies: dict[tuple[str, bool], Tally] = {}
    for label, summarizer in summarizers.items():
        pairs = [one(seed, settings, summarizer) for seed in range(n)]
        for control in (False, True):
            t = Tally([pair[control] for pair in pairs])
            tallies[(label, control)] = t
            print(
                f"bench: {NAME}: {label}{' control' if control else ''}: visible "
                f"{t.count('visible')}/{t.valid}, re-prepared {t.count('reprepared')}",
                flush=True,
            )
    return report(tallies, n, settings, checks)


def report(
    tallies: dict[tuple[str, bool], Tally], n: int, settings: Any, checks: list[str]
) -> Result:
    table = [
        "| summarizer | runs | valid | visible | with its record | re-prepared | not applied "
        "| arrived messages folded in too |",
        "|---|---|---|---|---|---|---|---|",
    ]
    met = True
    measured = []
    reasons: list[str] = []
    for (label, control), t in tallies.items():
        v = t.valid
        vis, rec, rep = t.count("visible"), t.count("with_record"), t.count("reprepared")
        failed = sum(r.valid and not r.applied for r in t.runs)
        name = f"{label}, control (unknown id)" if control else label
        vis_cell = "-" if control else f"{vis}/{v} ({vis / v if v else 0:.1%})"
        rec_cell = "-" if control else f"{rec}/{v} ({rec / v if v else 0:.1%})"
        table.append(
            f"| {name} | {len(t.runs)} | {v} | {vis_cell} | {rec_cell} | "
            f"{rep}/{v} ({rep / v if v else 0:.1%}) | {failed} | {t.count('folded')} |"
        )
        if not control:
            met = met and v > 0 and vis / v >= VISIBLE_TARGET and rep / v <= REPREPARED_TARGET
            measured.append(
                f"{label}: visible {vis / v if v else 0:.1%}, re-prepared {rep / v if v else 0:.1%}"
            )
        for r in t.runs:
            if r.reason and len(reasons) < 4:
                reasons.append(f"{name}: {r.reason}")
    return Result(
        "16. Check before the swap",
        f"an id that only the removed part held, referred to by a message that arrived while the "
        f"summary was written, stays visible in >= 99% of {n} runs; <= 5% of valid compactions "
        "re-prepared",
        "; ".join(measured),
        met,
        [
            f"{n} seeded runs per summarizer at the default settings (threshold "
            f"{settings.summarization_threshold_chars:,}, keep {settings.summarization_keep_chars:,} "
            "chars): a thread of record listings (orders, pods, reservations) up to the prepare "
            "point, a compaction prepared on it, filler and one message referring to a record "
            "only the removed part held appended until the thread is 0-25% over its threshold, "
            "then fit_now(prepared, thread, settings) as every apply calls it; "
            "a Stale one re-prepared on the thread as it is",
            "visible: the id in a kept message the plan saw, or on a summary line that neither "
            "cites an arrived message nor quotes one; with its record: that line also holds the "
            "record's amount",
            "control: the same runs with the reference to an id found nowhere (what the check "
            "costs when there is nothing to rescue)",
            "offline: the offline summarizer behind the fact guard; stub: the LLM-shaped stub "
            "that names nothing (benchmark 14) behind the fact guard",
            "rule self-check (a line added to a prepared summary): " + "; ".join(checks),
            *reasons,
        ],
        "",
        table,
    )
