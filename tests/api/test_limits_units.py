"""The streaming body check (``api/limits/``, issue 20, items 1-4), without a server: the
scan's counts against a parser's, whatever the chunking; what it refuses and how it names
the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offpath.api.limits.checks import is_json_media, nul_parameter
from offpath.api.limits.scan import JsonScan, TooMuch
from offpath.stores.values import unstorable


def values_in(doc) -> int:
    """The values a parsed document holds: array items and object members, at any depth."""
    if isinstance(doc, dict):
        return len(doc) + sum(values_in(v) for v in doc.values())
    if isinstance(doc, list):
        return len(doc) + sum(values_in(v) for v in doc)
    return 0


def depth_of(doc) -> int:
    if isinstance(doc, dict | list):
        inner = doc.values() if isinstance(doc, dict) else doc
        return 1 + max((depth_of(v) for v in inner), default=0)
    return 0


def scan(body: bytes, chunk: int, depth: int = 32, values: int = 10**9, messages: int = 10**9):
    s = JsonScan(depth, values, messages)
    for at in range(0, len(body), chunk):
        s.feed(body[at : at + chunk])
    return s


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(
        alphabet=st.sampled_from(list('ab"\\[]{},: \n\t\u00e9\u4e2d\U0001f600/')), max_size=8
    ),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(alphabet=st.sampled_from(list('k"\\[]{},:')), max_size=5), children, max_size=4
        )
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(doc=JSON, chunk=st.integers(1, 40), indent=st.sampled_from([None, 1]), ascii_=st.booleans())
def test_the_scan_counts_what_the_parser_reads_whatever_the_chunks(doc, chunk, indent, ascii_):
    body = json.dumps(doc, indent=indent, ensure_ascii=ascii_).encode()
    s = scan(body, chunk)
    assert s.values == values_in(doc)
    assert not s.stack and not s.in_string


@settings(max_examples=200, deadline=None)
@given(doc=JSON, chunk=st.integers(1, 40))
def test_the_scan_refuses_exactly_the_documents_nested_too_deep(doc, chunk):
    body = json.dumps(doc).encode()
    limit = 3
    try:
        scan(body, chunk, depth=limit)
        refused = False
    except TooMuch as exc:
        assert exc.status == 422 and "MAX_JSON_DEPTH" in exc.detail
        refused = True
    assert refused == (depth_of(doc) > limit)


TRICKY = [
    ['a\\"b[', "\\", "x\\", '"', "\\\\", "]{,:"],
    {'k"\\[': [[], {}, [1]], "": {"a\\": 'b"}'}},
    ['\u00e9"\\u', 1.5e10, None, True, [["\U0001f600"]]],
]


@pytest.mark.parametrize("doc", TRICKY)
def test_every_split_of_a_body_full_of_escapes_counts_the_same(doc):
    for ascii_ in (True, False):
        body = json.dumps(doc, ensure_ascii=ascii_).encode()
        for chunk in range(1, len(body) + 1):
            s = scan(body, chunk)
            assert (s.values, s.stack, s.in_string) == (values_in(doc), [], False), chunk


def test_a_million_items_are_refused_at_the_limit_before_any_parsing():
    body = b'{"messages": [' + b",".join([b"0"] * 1_000_000) + b"]}"
    with pytest.raises(TooMuch) as caught:
        scan(body, 16_384, values=200_000, messages=10_000)
    assert caught.value.detail == (
        "messages: more than 10000 messages in one turn (MAX_TURN_MESSAGES)"
    )
    state = b'{"state": {"a": [' + b",".join([b"0"] * 500_000) + b"]}}"
    with pytest.raises(TooMuch, match=r"body: more than 200000 JSON values \(MAX_JSON_VALUES\)"):
        scan(state, 16_384, values=200_000, messages=10_000)


def test_the_messages_cap_counts_the_top_level_messages_only_and_reads_escaped_keys():
    turn = {"messages": [{"type": "human", "content": "x"}] * 10}
    assert scan(json.dumps(turn).encode(), 7, messages=10).values == values_in(turn)
    with pytest.raises(TooMuch, match="MAX_TURN_MESSAGES"):
        scan(json.dumps({"messages": [0] * 11}).encode(), 7, messages=10)
    # the same key written with escapes (the parser reads "messages"), split anywhere
    escaped = b'{"mess\\u0061ges": [' + b",".join([b"0"] * 11) + b"]}"
    for chunk in range(1, len(escaped) + 1):
        with pytest.raises(TooMuch, match="MAX_TURN_MESSAGES"):
            scan(escaped, chunk, messages=10)
    nested = {"state": {"messages": [0] * 11}, "messages": []}
    assert scan(json.dumps(nested).encode(), 5, messages=10).values == values_in(nested)


def test_depth_refusals_name_the_field():
    body = json.dumps({"messages": [{"type": "ai", "args": {"deep": [[[[]]]]}}]}).encode()
    with pytest.raises(TooMuch) as caught:
        scan(body, 3, depth=5)
    assert caught.value.detail == (
        "messages[0].args.deep[0]: nested deeper than 5 levels (MAX_JSON_DEPTH)"
    )


def test_a_long_string_costs_no_memory_per_char_and_its_escapes_cross_chunks():
    body = json.dumps({"c": "x" * 5_000_000 + '"\\' * 1000 + "]" * 1000}).encode()
    s = scan(body, 16_384, depth=2)
    assert s.values == 1 and not s.in_string
    import tracemalloc

    escapes = json.dumps({"c": "\\n" * 2_000_000}).encode()  # 8 MB of escapes
    tracemalloc.start()
    scan(escapes, 16_384)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1_000_000  # the old regex kept ~115 bytes per char: 460 MB here


def test_a_raw_nul_byte_is_refused():
    with pytest.raises(TooMuch, match="NUL byte"):
        scan('{"a": 1}'.encode("utf-16"), 4)


@pytest.mark.parametrize(
    ("content_type", "json_"),
    [
        ("application/json", True),
        ("Application/JSON", True),
        ("APPLICATION/JSON; charset=UTF-8", True),
        ("application/vnd.offpath+JSON", True),
        ("text/plain", False),
        ("application/x-www-form-urlencoded", False),
        (None, True),  # FastAPI does not parse it, but the scan checks it all the same
    ],
)
def test_media_types_are_read_as_fastapi_reads_them_in_any_case(content_type, json_):
    assert is_json_media(content_type) is json_


def test_nul_and_surrogates_are_refused_naming_the_field():
    assert unstorable({"messages": [{"content": "a\x00b"}]}) == (
        "body.messages[0].content: NUL characters are not accepted (PostgreSQL stores none; "
        "send the text without them)"
    )
    assert unstorable({"state": {"k\x00": 1}}).startswith("body.state key: NUL")
    assert "surrogate" in unstorable({"c": "ok \ud800"})
    assert unstorable({"c": "é ok \U0001f600"}) is None
    assert nul_parameter(b"q=%00") == "q"
    assert nul_parameter(b"limit=5&summary_id=a%00b") == "summary_id"
    assert nul_parameter(b"q=%2500") is None  # "%00" as text, not a NUL
    assert nul_parameter(b"q=abc") is None


def test_a_run_of_19_digits_is_seen_wherever_the_chunks_split_it():
    body = b'{"a": [1, 22, 1234567890123456789]}'
    for chunk in range(1, len(body) + 1):
        assert scan(body, chunk).long_digits, chunk
    assert not scan(b'{"a": [123456789012345678, "x"]}', 3).long_digits


@settings(max_examples=400, deadline=None)
@given(doc=JSON, chunk=st.integers(1, 40), indent=st.sampled_from([None, 1]))
def test_no_valid_body_within_the_value_limit_is_refused_for_its_tokens(doc, chunk, indent):
    """Issue 34, item 4: every token counts (``:``, keys, brackets), against what the value
    limit allows; a body the value limit accepts is never refused for its tokens."""
    body = json.dumps(doc, indent=indent).encode()
    s = scan(body, chunk, depth=max(1, depth_of(doc)), values=max(1, values_in(doc)))
    assert s.tokens <= s.max_tokens


def test_tokens_that_count_no_value_are_bounded_and_a_stray_closer_is_refused():
    for body in (b"{" + b":" * 100_000 + b"}", b"[" + b'"k"' * 100_000 + b"]"):
        with pytest.raises(TooMuch, match="more tokens than 1000 JSON values hold"):
            scan(body, 4096, values=1_000)
    with pytest.raises(TooMuch, match=r"the \] at byte 8 closes nothing"):
        scan(b'{"a": 1}]', 3)


def test_json_inside_a_message_s_strings_is_read_with_the_body_s_rules():
    """Issue 34, item 1: each string langchain_core parses as JSON is scanned from where it
    lands (its depth counted from the body), its values counted with the body's, its parsed
    values held to the stores' rule; an OpenAI call's arguments become the object it holds."""
    from offpath.api.limits.inner import JsonBudget, check_message

    def call(arguments: str) -> dict:
        function = {"name": "f", "arguments": arguments}
        return {"role": "assistant", "tool_calls": [{"id": "c", "function": function}]}

    sent = call('{"q": [1, 2]}')
    checked, problem = check_message(sent, "messages[0]", JsonBudget(32, 100, 100))
    assert problem is None and checked["tool_calls"][0]["function"]["arguments"] == {"q": [1, 2]}
    assert sent["tool_calls"][0]["function"]["arguments"] == '{"q": [1, 2]}'  # a copy changed
    deep = '{"a": ' + "[" * 26 + "]" * 26 + "}"  # 6 levels of the body + 27
    _, problem = check_message(call(deep), "messages[0]", JsonBudget(32, 100, 100))
    assert problem.startswith("messages[0].tool_calls[0].function.arguments: JSON nested deeper")
    budget = JsonBudget(32, 100, 5)  # the body's scan left 5 values
    assert check_message(call('{"q": [1, 2]}'), "messages[0]", budget)[1] is None
    assert budget.values_left == 2
    _, problem = check_message(call('{"q": [1, 2]}'), "messages[1]", budget)
    assert "more than 100 values (MAX_JSON_VALUES)" in problem
    chunk = {
        "type": "AIMessageChunk",
        "data": {
            "content": "",
            "tool_call_chunks": [{"id": "c", "name": "f", "args": '{"q": "a\\u0000', "index": 0}],
        },
    }
    _, problem = check_message(chunk, "messages[2]", JsonBudget(32, 100, 100))
    assert problem.startswith("messages[2].data.tool_call_chunks[0].args.q: NUL characters")
    assert check_message(call("not JSON"), "m", JsonBudget(32, 100, 100)) == (
        call("not JSON"),
        None,
    )
