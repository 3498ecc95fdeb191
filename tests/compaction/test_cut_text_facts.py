"""Facts from text offpath cut at a boundary (issue 32, benchmark 20: ``PixelRepresentati``
pinned as a name the agent said): a value cut mid-word is never a fact, pinned, quoted or
reported lost; the value whole is listed in the cut's note instead."""

from __future__ import annotations

import re

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from offpath.compaction.facts.extraction import extract, facts_of
from offpath.compaction.facts.pinning import pin
from offpath.compaction.facts.sections import clip_around, without_cut_runs
from offpath.compaction.frontier import one_line
from offpath.compaction.prompt import shorten as prompt_shorten
from offpath.compaction.shorten import MIN_ARGUMENT_CHARS, shorten

WORD = "PixelRepresentation"
SAID = (
    "The section of code that checks for required elements includes `BitsAllocated` and "
    f"{WORD} as required attributes. However, according to the issue, {WORD} should not be "
    "required for Float Pixel Data or Double Float Pixel Data. We need to modify this check "
    "to exclude it from the list of required elements when FloatPixelData or "
    "DoubleFloatPixelData is present in the dataset, as numpy_handler.py line 287 shows. "
) * 3


def whole(value: str, original: str) -> bool:
    """``value`` is found in ``original`` with no word char next to it."""
    return re.search(rf"(?<!\w){re.escape(value)}(?!\w)", original) is not None


def clipped(message, original: str) -> list[str]:
    return [s.value for s in facts_of(message) if not whole(s.value, original)]


def test_a_shortened_message_cut_mid_word_gives_no_fact_of_the_part_cut():
    """At every cap, the agent's message shortened (head, note, tail) gives no value that is
    not whole in the original, and the word the cut split is still among its facts (listed
    whole in the note)."""
    message = AIMessage(content=SAID, id="said-1")
    split = 0
    for cap in range(200, len(SAID), 3):
        short = shorten(message, cap, floor=200)
        text = str(short.content)
        head = text[: text.find("\n[offpath: ")]
        split += bool(re.search(r"\w$", head) and not whole(head.split()[-1], SAID))
        assert clipped(short, SAID) == [], cap
        if cap >= 600:  # room for the note's facts
            assert WORD in {s.value for s in facts_of(short)}, cap
    assert split > 10  # the caps did cut words


def test_a_request_shortened_mid_url_names_no_cut_url():
    url = "https://github.com/pydicom/pydicom/blob/8da0b9b215ebfad5756051c891def88e426787e7/x.py"
    text = ("Please look at this file. " * 20 + url + " and fix it. ") * 4
    message = HumanMessage(content=text, id="ask-1")
    for cap in range(300, len(text), 7):
        assert clipped(shorten(message, cap, floor=200), text) == [], cap


def test_a_cut_argument_head_gives_no_fact_cut_mid_word():
    """A tool call's multi-line argument offpath cut keeps its first line to 200 chars: the
    run the cut split is not read (the agent's action is stated: it would rank first)."""
    path = "/pydicom__pydicom/pydicom/pixel_data_handlers/numpy_handler.py"
    first = ("x " * ((MIN_ARGUMENT_CHARS - len(path)) // 2 + 10)) + path + " end"
    value = first + "\n" + "line two\n" * 60
    call = {"id": "c1", "name": "bash", "args": {"command": value}}
    message = AIMessage(content="", tool_calls=[call], id="act-1")
    short = shorten(message, 400, floor=200)
    cut = short.tool_calls[0]["args"]["command"]
    assert cut.split("\n", 1)[0] != first  # cut mid-word
    assert clipped(short, value) == []


def test_pinned_facts_and_loss_hold_no_value_cut_mid_word():
    """The guard's pins and the facts a loss report counts, of removed messages shortened
    mid-word (an agent's message and a tool result), hold no value cut mid-word."""
    result = "\n".join(f"{i}: Unable to convert the pixel data: missing {WORD}" for i in range(40))
    removed = [
        AIMessage(content=SAID, id="said-2"),
        ToolMessage(content=result, tool_call_id="c2", id="res-2"),
    ]
    for cap in range(300, 1400, 11):
        short = [shorten(m, cap, floor=200) for m in removed]
        text, _ = pin("**Investigating:** the issue.", short, 2_000)
        assert not re.search(r"PixelRep\w*", text.replace(WORD, "")), (cap, text)
        values = {f.value for f in extract(short)}
        assert all(whole(v, SAID + "\n" + result) for v in values), cap


def test_what_a_summary_reads_of_a_shortened_result_has_no_word_cut_mid_way():
    """The offline summarizer and the summarizer's prompt read a shortened result as
    :func:`without_cut_runs` gives it: the run the cut split blanked, offsets kept."""
    result = " ".join(f"{i} ERROR missing {WORD} in dataset;" for i in range(60))
    message = ToolMessage(content=result, tool_call_id="c3", id="res-3")
    split = 0
    for cap in range(600, 1200, 7):
        body = str(shorten(message, cap, floor=200).content)
        head = body[: body.find("\n[offpath: ")]
        split += not whole(head.split()[-1], result)
        read = without_cut_runs(body)
        assert len(read) == len(body)
        assert all(whole(w, result) for w in read[: len(head)].split()), cap
    assert split > 10  # the caps did cut words
    assert without_cut_runs(result) is result  # text offpath did not cut: as it is


def test_a_clipped_line_with_no_space_is_cut_between_words():
    line = ",".join(f"app.kubernetes.io/name=loki-{i}" for i in range(20)) + ",key=" + WORD
    clip = clip_around(line, line.find(WORD), WORD, 80)
    inner = clip.strip(".")
    assert WORD in inner
    assert all(whole(v, line) for v in re.findall(r"[\w./=-]+", inner))


def test_a_clipped_media_reference_names_no_url():
    url = "https://example.com/" + "a" * 400 + ".png"
    message = HumanMessage(
        content=[{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": url}}],
        id="img-1",
    )
    assert [s.value for s in facts_of(message) if s.value.startswith("http")] == []


def test_a_line_clipped_with_no_space_ends_before_the_word_it_would_split():
    """The summary's frontier (read back as what the agent said) and the summarizer's prompt
    clip long text: with no space to cut at, they cut before the word they would split."""
    url = "https://github.com/pydicom/pydicom/blob/" + "8da0b9b215ebfad5" * 6 + "/x.py"
    assert one_line("see:" + url, 120) == "..."  # one run of chars: none of it
    for limit in range(200, 900, 13):
        cut = prompt_shorten(f"{WORD} " * 40 + url + " done", limit)
        shown = re.sub(r"\n\[\.\.\. \d+ chars omitted \.\.\.\]\n", " ", cut)
        assert all(whole(w, f"{WORD} {url} done") for w in shown.split()), limit


def test_a_request_in_a_script_without_spaces_keeps_its_head():
    """A request in Chinese (no spaces to cut at) keeps the most of its head that fits, not
    only "..."; a cut after such a char splits no ASCII value (an id, a path)."""
    request = "请检查支付服务的日志并找出过去一小时内所有超时错误的根本原因" * 4
    line = one_line(request, 60)
    assert line == request[:57] + "..."
    mixed = one_line("调查 checkout-api-7f9c 的错误日志并说明原因" + "再" * 60, 40)
    assert mixed.startswith("调查 checkout-api-7f9c 的错误日志") and len(mixed) <= 40
    assert one_line("调查 " + "checkout-api-" * 9, 40) == "调查..."  # the ASCII run is not split
