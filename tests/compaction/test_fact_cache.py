"""Facts found once per message (issue 22, item "the job's CPU"): :func:`facts.extract` now
merges each message's facts, computed once per process, and must give what the reading of
the whole thread gave before the change. The reference below is the version before it (the
per-thread pass, kept here as it was), run on every shared transcript, every case and the
SRE sessions, with the cache cold and warm; the summaries and pinned facts the guard writes
must be the same too.

:func:`facts.find` skips a pattern whose gate finds nothing in a text (issue 22, the scans):
:func:`reference_find` below is the plain scan of every pattern, as before, which the
reference extraction uses; the fast path must find the same facts in every block of every
thread, and give the same summaries, pinned facts and loss reports at two sizes."""

from __future__ import annotations

import dataclasses
import gc

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from shared import CASES, TRANSCRIPTS, load, messages_of
from sre_sessions import sre_session

import offpath.compaction.facts.extraction as extraction
import offpath.compaction.loss as loss
from offpath.compaction.facts import pinning
from offpath.compaction.facts.extraction import (
    _MERGED,
    MERGED_CACHE_SIZE,
    Fact,
    _Key,
    _observed,
    extract,
)
from offpath.compaction.facts.patterns import (
    _CITED,
    _CONFIG_KEY,
    _KINDS,
    _NEVER,
    _NOT_NAMES,
    _REGEX_GATES,
    _WORD_GATES,
    ERROR_LINE,
    NOISE_LINE,
    _is_name,
    find,
)
from offpath.compaction.facts.reading import fact_blocks, role_age, tool_arguments
from offpath.compaction.facts.sections import clip_around
from offpath.compaction.pipeline import Skip, compact
from offpath.compaction.summarizers.guarded import GuardedSummarizer
from offpath.compaction.summarizers.offline import OfflineSummarizer
from offpath.compaction.summary import looks_like_instruction, may_hold_instruction
from offpath.config import load_settings


def reference_find(text):
    """facts.find before issue 22's gates: every pattern scanned over the whole text."""
    taken = bytearray(len(text))
    out = []
    for m in _CITED.finditer(text):  # offpath's own recall("id") pointers: not facts
        taken[m.start(1) : m.end(1)] = b"\x01" * (m.end(1) - m.start(1))
    for kind, pattern, _ in _KINDS:
        for m in pattern.finditer(text):
            group = m.lastindex or 0
            start, end = m.span(group)
            if taken.find(1, start, end) != -1:
                continue
            value = m.group(group).rstrip(".,:;")
            if "\n" in value or (kind == "identifier" and not _is_name(value)):
                continue
            if value in _NEVER or (
                kind in ("name", "term") and value.casefold().strip("_") in _NOT_NAMES
            ):
                continue
            if kind == "config" and "=" in value and not _CONFIG_KEY.search(value.split("=")[0]):
                continue
            if "  " in value or "\t" in value:
                value = " ".join(value.split())
            if kind == "quantity" and value.count("/") > 1:
                continue
            taken[start:end] = b"\x01" * (end - start)
            out.append((value, kind, start))
    out.sort(key=lambda f: f[2])
    return out


def reference_extract(messages):
    """facts.extract before issue 22: one pass over the whole thread."""
    out: dict[str, Fact] = {}
    for m in messages:
        for value, line in tool_arguments(m):
            fact = out.get(value)
            if fact is None:
                fact = out[value] = Fact(value, "argument", str(m.id), line, order=len(out))
                fact._seen.add(str(m.id))
            fact.stated, fact.noise = True, False
        for text, role, mid in fact_blocks(m):
            role, age = role_age(role)
            instruction: dict[int, bool] = {}
            noisy: dict[int, bool] = {}
            errors: dict[int, bool] = {}
            test_lines = may_hold_instruction(text)
            data = role == "data"
            for value, kind, offset in reference_find(text):
                if kind in ("name", "line", "term") and role not in (
                    "agent",
                    "user",
                    "carried",
                    "carried said",
                    "carried stated",
                ):
                    continue
                if kind == "term" and role == "user":
                    continue
                fact = out.get(value)
                line = ""
                start = 0
                if fact is None or test_lines or data:
                    start = text.rfind("\n", 0, offset) + 1
                    end = text.find("\n", offset)
                    line = text[start : end if end >= 0 else len(text)]
                    if test_lines:
                        if start not in instruction:
                            instruction[start] = looks_like_instruction(line)
                        if instruction[start]:
                            continue
                if fact is None:
                    fact = out[value] = Fact(
                        value,
                        kind,
                        mid,
                        clip_around(line, offset - start, value),
                        order=len(out),
                        age=age,
                    )
                    fact._seen.add(mid)
                elif mid not in fact._seen:
                    fact._seen.add(mid)
                    fact.messages += 1
                if data:
                    if start not in noisy:
                        noisy[start] = bool(NOISE_LINE.search(line))
                        errors[start] = not noisy[start] and bool(ERROR_LINE.search(line))
                    if not noisy[start]:
                        fact.noise = False
                    fact.error = fact.error or errors[start]
                else:
                    fact.noise = False
                    said = role in ("agent", "carried said")
                    fact.stated = fact.stated or said or role in ("action", "carried stated")
                    fact.said = fact.said or said
                    fact.asked = fact.asked or (role == "user" and not extraction.is_document(text))
                    fact.carried = fact.carried or role.startswith("carried")
    return list(out.values())


def as_rows(found):
    return [dataclasses.astuple(f) for f in found]


def threads():
    for path in TRANSCRIPTS + CASES:
        yield path.stem, messages_of(load(path))
    for k in range(3):
        yield f"sre-{k}", sre_session(seed=k)


THREADS = list(threads())


def test_the_merge_makes_each_fact_with_its_fields_in_the_dataclass_order():
    """The merge passes a new Fact's fields positionally, in FACT_FIELDS' order: a field added
    or moved in Fact fails here before it is given another field's value."""
    assert extraction.FACT_FIELDS == tuple(f.name for f in dataclasses.fields(extraction.Fact))


@pytest.mark.parametrize(("name", "messages"), THREADS, ids=[n for n, _ in THREADS])
def test_extract_gives_what_the_per_thread_pass_gave(name, messages):
    _observed.cache_clear()
    _MERGED.clear()
    want = as_rows(reference_extract(messages))
    assert as_rows(extract(messages)) == want  # cold: each message read now
    assert _observed.cache_info().currsize > 0
    assert as_rows(extract(messages)) == want  # warm: the same messages, merged before
    _MERGED.clear()
    assert as_rows(extract(messages)) == want  # warm: each message from the cache
    # any window of the thread, its messages read before in another order
    half = len(messages) // 2
    for part in (messages[half:], messages[:half], messages[1::2]):
        assert as_rows(extract(part)) == as_rows(reference_extract(part))


@pytest.mark.parametrize(("name", "messages"), THREADS, ids=[n for n, _ in THREADS])
def test_find_gives_what_the_plain_scan_gave(name, messages):
    for m in messages:
        for text, _, _ in fact_blocks(m):
            assert find(text) == reference_find(text), (name, m.id)


def test_a_merged_result_is_kept_for_the_same_messages_only():
    _MERGED.clear()
    a = ToolMessage("pod checkout-api-7f9c4 OOMKilled, exit code 137", tool_call_id="c1", id="t1")
    b = AIMessage("Restarting checkout-api-7f9c4 (ticket INC-4821).", id="a1")
    first = extract([a, b])
    again = extract([a, b])
    assert again == first and again is not first  # a new list of the same facts
    assert as_rows(extract([b, a])) == as_rows(reference_extract([b, a]))  # order counts
    assert as_rows(extract([a])) == as_rows(reference_extract([a]))
    for k in range(MERGED_CACHE_SIZE + 2):  # bounded
        extract([HumanMessage(f"ticket OPS-{k}", id=f"h{k}")])
    assert len(_MERGED) == MERGED_CACHE_SIZE


def test_a_ranking_kept_per_merge_is_ranks_own():
    _MERGED.clear()
    a = ToolMessage("pod checkout-api-7f9c4 OOMKilled, exit code 137", tool_call_id="c1", id="t1")
    b = AIMessage("Restarting checkout-api-7f9c4 (ticket INC-4821 in ops/deploy.yaml).", id="a1")
    facts, ranked = extraction.extract_ranked([a, b])
    assert facts == extract([a, b]) and ranked == extraction.rank(facts)
    again, ranked_again = extraction.extract_ranked([a, b])
    assert ranked_again == ranked and ranked_again is not ranked  # kept, handed out as a copy
    assert [f.value for f in extraction.extract_ranked([b, a])[1]] == [
        f.value for f in extraction.rank(reference_extract([b, a]))
    ]
    _MERGED.clear()  # merged anew: ranked anew, never the facts of the merge before
    facts3, ranked3 = extraction.extract_ranked([a, b])
    assert all(any(f is g for g in facts3) for f in ranked3)


def test_every_gate_belongs_to_a_pattern():
    # gates are keyed by their pattern's source: a pattern changed without its gate is
    # scanned in full (still right, only slower); this names the gate to write again
    sources = {pattern.pattern for _, pattern, _ in _KINDS}
    assert set(_REGEX_GATES) <= sources
    assert set(_WORD_GATES) <= sources


def test_word_gates_leave_non_ascii_text_to_the_scan():
    # re's IGNORECASE reads "ſ" as "s" and "İ" as "i"; str.lower does not: such text is scanned
    for text in ("ſtatus code: 137 after the restart", "request_İd=4f9c2e7a-01 failed"):
        assert find(text) == reference_find(text)
    assert any(kind == "error_code" for _, kind, _ in find("ſtatus code: 137"))


@pytest.mark.parametrize("sizes", [(4_000, 1_500), (12_000, 4_000)], ids=["4k", "12k"])
@pytest.mark.parametrize(("name", "messages"), THREADS, ids=[n for n, _ in THREADS])
def test_summaries_and_pinned_facts_are_unchanged(name, messages, sizes, monkeypatch):
    threshold, keep = sizes
    settings = load_settings(summarization_threshold_chars=threshold, summarization_keep_chars=keep)
    guarded = GuardedSummarizer(OfflineSummarizer(), settings.summary_pinned_max_chars)
    got = compact(messages, settings, guarded)
    got_loss = None
    if not isinstance(got, Skip):
        got_loss = loss.loss_report(got.plan.removed, got.result.text, got.plan.kept)

    def reference_ranked(found):
        facts = reference_extract(found)
        return facts, extraction.rank(facts)

    monkeypatch.setattr(pinning, "extract_ranked", reference_ranked)
    monkeypatch.setattr(loss, "extract_ranked", reference_ranked)
    want = compact(messages, settings, guarded)
    if isinstance(want, Skip):
        assert isinstance(got, Skip) and got == want
        return
    assert [m.content for m in got.patch] == [m.content for m in want.patch]
    assert got.summary.content == want.summary.content
    want_loss = loss.loss_report(want.plan.removed, want.result.text, want.plan.kept)
    assert got_loss == want_loss


def test_a_changed_message_is_read_again():
    # the cache is keyed by what the facts depend on: a result shortened in place (same id)
    # or a message whose tool call changed is not served the old facts
    _observed.cache_clear()
    _MERGED.clear()
    before = ToolMessage("pod checkout-api-7f9c4 OOMKilled", tool_call_id="c1", id="t1")
    after = ToolMessage("pod ledger-db-0 OOMKilled", tool_call_id="c1", id="t1")
    assert "checkout-api-7f9c4" in {f.value for f in extract([before])}
    values = {f.value for f in extract([after])}
    assert "ledger-db-0" in values and "checkout-api-7f9c4" not in values
    call = AIMessage("", id="a1", tool_calls=[{"name": "get", "args": {"id": "XEHQWM"}, "id": "c"}])
    other = AIMessage(
        "", id="a1", tool_calls=[{"name": "get", "args": {"id": "QWERTY7"}, "id": "c"}]
    )
    assert "XEHQWM" in {f.value for f in extract([call])}
    assert "XEHQWM" not in {f.value for f in extract([other])}


def test_the_cache_keeps_digests_not_messages():
    big = HumanMessage("ticket INC-4821 " + "x" * 100_000, id="h1")
    key = _Key(big)
    assert len(key.digest) == 16 and key.message is big
    _observed.cache_clear()
    _MERGED.clear()
    _observed(key)
    assert key.message is None  # the cache holds this key: its message was let go
    assert _observed(_Key(big)) == _observed(key)


def test_kept_facts_leave_the_collectors_generations_at_its_first_passes():
    """The facts a process keeps (found here, or read from the store) are plain tuples of
    strings, numbers and tuples: the collector stops tracking them at its first passes (a
    tuple once the tuples it holds are), so a full collection does not walk the ~170,000
    that the cache's messages hold. Named tuples it tracked for good."""
    from offpath.stores.facts import decode, encode

    found = ToolMessage("ERR-5012 on db-primary-2 at 10:31:02 UTC", tool_call_id="c1", id="t1")
    stored = ToolMessage("checkout-api-7f9c4 OOMKilled, exit code 137", tool_call_id="c2", id="t2")
    _observed.cache_clear()
    extraction.take(extraction.key_digest(stored), decode(encode(stored)))
    kept = [*_observed(_Key(found)), *_observed(_Key(stored))]
    assert len(kept) >= 4 and all(type(s) is tuple for s in kept)
    gc.collect()
    gc.collect()
    assert not any(gc.is_tracked(s) for s in kept)
    # the public form keeps its names
    assert extraction.facts_of(found) == extraction.found_now(found)
    assert "OOMKilled" in {s.value for s in extraction.facts_of(stored)}


# --- facts found in one process, read in another (the API finds them as a turn arrives,
# the worker's job reads them from Redis by the message's key) -----------------------------


class Held:
    """A fact store's Redis stand-in for the preload tests: ``mget`` of what was set."""

    def __init__(self, entries):
        self.entries = entries

    def mget(self, keys):
        return [self.entries.get(k) for k in keys]


def store_of(messages, *, skip=()):
    from offpath.stores.facts import FactStore, encode

    store = FactStore(None, "p")
    entries = {store.key(extraction.key_digest(m)): encode(m) for m in messages if m not in skip}
    store.redis = Held(entries)
    return store


@pytest.mark.parametrize(("name", "messages"), THREADS, ids=[n for n, _ in THREADS])
def test_facts_found_elsewhere_give_what_finding_them_here_gives(name, messages, monkeypatch):
    store = store_of(messages)
    _observed.cache_clear()
    _MERGED.clear()
    monkeypatch.setattr(extraction, "_LOADED", type(extraction._LOADED)())
    assert store.preload(messages) == len({extraction.key_digest(m) for m in messages})

    def found_again(m):
        raise AssertionError(f"{m.id}: found again, not read from the store")

    monkeypatch.setattr(extraction, "_observe", found_again)
    assert as_rows(extract(messages)) == as_rows(reference_extract(messages))


def test_a_message_the_store_lacks_is_found_here(monkeypatch):
    from offpath.stores.facts import decode

    a = ToolMessage("pod checkout-api-7f9c4 OOMKilled, exit code 137", tool_call_id="c1", id="t1")
    b = AIMessage("Restarting checkout-api-7f9c4 (ticket INC-4821).", id="a1")
    _observed.cache_clear()
    _MERGED.clear()
    monkeypatch.setattr(extraction, "_LOADED", type(extraction._LOADED)())
    assert store_of([a, b], skip=[b]).preload([a, b]) == 1
    assert as_rows(extract([a, b])) == as_rows(reference_extract([a, b]))
    # an entry that is not a message's facts (another version's) is found again
    _observed.cache_clear()
    _MERGED.clear()
    bad = store_of([a])
    bad.redis.entries = dict.fromkeys(bad.redis.entries, b'{"v": 2}')
    assert bad.preload([a]) == 0
    assert as_rows(extract([a])) == as_rows(reference_extract([a]))
    with pytest.raises(ValueError):
        decode(b"[[], [[1]]]")


@pytest.mark.parametrize(("name", "messages"), THREADS, ids=[n for n, _ in THREADS])
def test_a_threads_tokens_are_read_with_its_facts(name, messages, monkeypatch):
    """Each message's tokens are stored with its facts where it arrives: a job reads them with
    the facts (one round trip for the thread) and counts only what the store lacks; its ratio
    is the one counting every message gives, and its facts are taken from what it read."""
    from offpath.compaction.tokens import encoder, measured_ratio, message_text

    enc = encoder()
    assert enc is not None  # quicktok is a dependency
    lacking = messages[1::3]
    store = store_of(messages, skip=lacking)
    stored = store.thread(messages)
    counts = stored.tokens()
    assert counts == [None if m in lacking else enc.count(message_text(m)) for m in messages]
    assert measured_ratio(messages, counted=counts) == measured_ratio(messages)
    _observed.cache_clear()
    _MERGED.clear()
    monkeypatch.setattr(extraction, "_LOADED", type(extraction._LOADED)())
    store.redis = None  # read once: the preload takes the facts from what was read
    held = {extraction.key_digest(m) for m in messages if m not in lacking}
    assert store.preload(messages, stored) == len(held)


def test_an_entry_stored_without_tokens_still_gives_its_facts():
    """An entry written before tokens were stored with the facts (the JSON alone): its
    message's tokens are counted by the job, its facts read as before."""
    from offpath.stores.facts import decode, encode, stored_tokens

    m = ToolMessage("pod checkout-api-7f9c4 OOMKilled, exit code 137", tool_call_id="c1", id="t1")
    raw = encode(m)
    old = raw.partition(b"\n")[2]
    assert old.startswith(b"[") and stored_tokens(old) is None and stored_tokens(None) is None
    assert decode(old) == decode(raw) == extraction.found_now(m)
    assert stored_tokens(b"-1\n" + old) is None  # counted without quicktok: not known


def test_a_process_that_counts_no_tokens_stores_none(monkeypatch):
    """A process that has not loaded the tokenizer (an API that only imports turns) does not
    load it to store tokens with the facts (~64 MiB): the job counts them."""
    from offpath.compaction import tokens
    from offpath.stores.facts import decode, encode, stored_tokens

    m = AIMessage("Restarting checkout-api-7f9c4 (ticket INC-4821).", id="a1")
    assert tokens.encoder() is not None  # this process counts tokens: they are stored
    assert stored_tokens(encode(m)) == tokens.message_tokens(m)
    monkeypatch.setattr(tokens, "_LOADED", set())
    raw = encode(m)
    assert stored_tokens(raw) is None and decode(raw) == extraction.found_now(m)


def test_the_store_keeps_each_new_message_once_and_says_nothing_when_redis_is_away():
    import uuid

    import redis
    from stack import REDIS_URL

    from offpath.stores.facts import FactStore, decode

    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"factstest-{uuid.uuid4().hex[:6]}"
    store = FactStore(client, prefix, ttl_s=60)
    thread = [
        HumanMessage("why is checkout-api failing? ticket INC-4821", id="h1"),
        ToolMessage("pod checkout-api-7f9c4 OOMKilled, exit code 137", tool_call_id="c", id="t1"),
    ]
    try:
        assert store.remember(thread) == 2
        later = AIMessage("Raised the limit of checkout-api-7f9c4 to 512Mi.", id="a1")
        assert store.remember([*thread, later]) == 1  # only what the turn added
        assert store.remember([*thread, later]) == 0
        digests = [extraction.key_digest(m) for m in (*thread, later)]
        got = store.fetch([*digests, b"\x00" * 16])
        assert set(got) == set(digests)
        assert all(0 < client.ttl(store.key(d)) <= 60 for d in digests)
        assert decode(got[digests[1]]) == _observed(_Key(thread[1]))
    finally:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        client.close()
    away = FactStore(redis.Redis(port=1, socket_connect_timeout=0.2), prefix)
    assert away.fetch(digests) == {}
    assert away.remember([HumanMessage("ticket OPS-1", id="h9")]) == 0


def test_within_unchanged_messages_a_merge_and_its_ranking_are_kept_whatever_others_merge():
    """A job's guard, index, patch and loss report merge and rank the same removed messages'
    facts; with many jobs at once in a process (a worker's threads) the others' merges must
    not push a job's out: within :func:`unchanged_messages` they are kept until it ends."""
    import threading

    a = ToolMessage("pod checkout-api-7f9c4 OOMKilled, exit code 137", tool_call_id="c1", id="t1")
    b = AIMessage("Restarting checkout-api-7f9c4 (ticket INC-4821).", id="a1")

    def others() -> None:  # another job's thread, merging more than the process keeps
        for k in range(MERGED_CACHE_SIZE + 2):
            extract([HumanMessage(f"ticket OPS-{k}", id=f"h{k}")])

    with extraction.unchanged_messages():
        facts, ranked = extraction.extract_ranked([a, b])
        other = threading.Thread(target=others)
        other.start()
        other.join()
        again, ranked_again = extraction.extract_ranked([a, b])
        assert all(f is g for f, g in zip(again, facts, strict=True))  # not merged again
        assert all(f is g for f, g in zip(ranked_again, ranked, strict=True))
        assert ranked_again is not ranked  # handed out as a copy
    assert as_rows(extract([a, b])) == as_rows(reference_extract([a, b]))


def test_within_unchanged_messages_a_message_is_keyed_and_digested_once(monkeypatch):
    import hashlib

    from offpath.compaction import shorten as digests

    hashed = []
    blake2b = hashlib.blake2b

    def counted(data, **kwargs):
        hashed.append(data)
        return blake2b(data, **kwargs)

    monkeypatch.setattr(extraction.hashlib, "blake2b", counted)
    monkeypatch.setattr(digests.hashlib, "blake2b", counted)
    a = ToolMessage("pod checkout-api-7f9c4 OOMKilled, exit code 137", tool_call_id="c1", id="t1")
    b = AIMessage("Restarting checkout-api-7f9c4 (ticket INC-4821).", id="a1")
    outside = as_rows(extract([a, b]))
    assert len(hashed) == 2
    extract([a, b])
    digests.digest(a), digests.digest(a)
    assert len(hashed) == 6  # outside the scope: each call hashes its messages again
    want = digests.raw_digest(a)
    hashed.clear()
    with extraction.unchanged_messages(), digests.digests_kept():
        assert as_rows(extract([a, b])) == outside
        assert as_rows(extract([a, b])) == outside
        assert extraction.key_digest(a) == extraction.key_digest(a)
        assert digests.digest(a) == digests.digest(a) == want
        assert len(hashed) == 3  # a's and b's keys, a's digest: once each
        # the memo is by object, never by id: another message under the same id is read
        changed = ToolMessage("pod ledger-db-0 OOMKilled", tool_call_id="c1", id="t1")
        values = {f.value for f in extract([changed])}
        assert "ledger-db-0" in values and "checkout-api-7f9c4" not in values
        assert digests.digest(changed) != digests.digest(a)
    hashed.clear()
    extract([a, b])
    assert len(hashed) == 2  # left: nothing kept


@pytest.fixture
def paused_redis(tmp_path):
    """A private redis-server (never the shared one: a pause holds every client's writes)
    and a function that holds its writes back for ``ms`` milliseconds (CLIENT PAUSE WRITE:
    reads are answered, writes wait)."""
    import redis
    from stack import free_port, start_redis

    port = free_port()
    proc = start_redis(port, tmp_path)
    client = redis.Redis(port=port, socket_timeout=10)
    try:
        yield client, lambda ms: client.execute_command("CLIENT", "PAUSE", str(ms), "WRITE")
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)


def test_the_store_writer_never_holds_its_caller_and_drops_what_is_over_its_cap(paused_redis):
    import time

    from stack import wait_for

    from offpath.stores.facts import MAX_PENDING, FactStore

    client, pause = paused_redis
    store = FactStore(client, "capped", ttl_s=60)
    pause(3000)
    started = time.monotonic()
    handed = [
        store.remember_soon([HumanMessage(f"ticket OPS-{k} on checkout-api", id=f"h{k}")])
        for k in range(MAX_PENDING + 10)
    ]
    assert time.monotonic() - started < 1.0  # the writes wait for Redis; the caller does not
    # the writer holds one batch (its write waits) and MAX_PENDING wait for it: the rest
    # are dropped (their facts are found by the job that removes them)
    assert MAX_PENDING <= sum(handed) <= MAX_PENDING + 1 and not handed[-1]
    wait_for(lambda: len(list(client.scan_iter("capped:facts:*"))) == sum(handed), timeout=15)


def test_the_middlewares_store_finds_each_message_once_and_keeps_the_originals_it_is_given():
    import uuid

    import redis
    from stack import REDIS_URL

    from offpath.compaction.facts.extraction import found_here, key_digest
    from offpath.stores.facts import FactStore, decode

    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"factstest-{uuid.uuid4().hex[:6]}"
    store = FactStore(client, prefix, ttl_s=60)
    pod = f"checkout-api-{uuid.uuid4().hex[:5]}"  # new text: no earlier test found its facts
    original = ToolMessage(f"pod {pod} OOMKilled\n" + "log line\n" * 500, tool_call_id="c", id="t")
    shortened = original.model_copy(update={"content": f"pod {pod} OOMKilled [offpath: ...]"})
    thread = [HumanMessage(f"why does {pod} restart?", id="h"), shortened]
    try:
        before = found_here()
        assert store.remember(thread, [original], kept=True) == 3
        assert store.remember(thread, [original], kept=True) == 0  # each once
        assert found_here() - before == 3
        extract([*thread, original])  # the process's own reads find them kept
        assert found_here() - before == 3
        got = store.fetch([key_digest(m) for m in (*thread, original)])
        assert [decode(got[key_digest(m)]) for m in (*thread, original)] == [
            _observed(_Key(m)) for m in (*thread, original)
        ]
    finally:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        client.close()


def test_the_middlewares_facts_reads_never_hold_a_call_and_are_bounded():
    import threading
    import time

    from stack import wait_for

    from offpath.agent.middleware.pools import MAX_READ_AHEADS, Background

    background = Background()
    gate = threading.Event()
    stored: list[int] = []

    def store(k):  # the fact store's write, held until the gate opens
        gate.wait(10)
        stored.append(k)

    started = time.monotonic()
    for k in range(MAX_READ_AHEADS + 5):
        background.read_ahead([HumanMessage(f"ticket OPS-{k}", id=f"h{k}")], lambda k=k: store(k))
    assert time.monotonic() - started < 1.0
    gate.set()
    wait_for(lambda: len(stored) == MAX_READ_AHEADS, timeout=10)
    time.sleep(0.2)
    assert stored == list(range(MAX_READ_AHEADS))  # the last five were dropped, not queued


def test_a_new_process_stores_only_what_no_other_process_stored():
    """A team's agent run as a command is a new process at each run: its first turn of a
    thread asks Redis which messages it holds (one round trip) instead of finding and
    storing every message's facts again."""
    import uuid

    import redis
    from stack import REDIS_URL

    from offpath.compaction.facts.extraction import found_here
    from offpath.stores.facts import FactStore

    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"factstest-{uuid.uuid4().hex[:6]}"
    tag = uuid.uuid4().hex[:5]
    thread = [
        HumanMessage(f"why is checkout-api-{tag} failing? ticket INC-4821", id="h1"),
        ToolMessage(f"pod checkout-api-{tag} OOMKilled, exit 137", tool_call_id="c", id="t1"),
        AIMessage(f"Raised the limit of checkout-api-{tag} to 512Mi.", id="a1"),
    ]
    later = HumanMessage(f"and payments-{tag}?", id="h2")
    try:
        assert FactStore(client, prefix).remember(thread, kept=True) == 3
        _observed.cache_clear()  # the next run's process: nothing found yet
        _MERGED.clear()
        before = found_here()
        again = FactStore(client, prefix)
        assert again.remember([*thread, later], kept=True) == 1
        assert found_here() - before == 1  # only the new message's facts were found
        assert again.remember([*thread, later], kept=True) == 0
    finally:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        client.close()
