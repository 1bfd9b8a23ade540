""":class:`JsonScanner` on hostile input, as a JSON library is tested.

Every text is scanned the way the submit paths do (members and elements streamed, deeper
values parsed whole) at several window sizes, down to one byte, so that every token is
split across windows somewhere. What is JSON decodes to what ``json.loads`` gives; what
is not is a :class:`NotJson` and never another exception. orjson, the strict decoder of
the other surfaces, is the reference for what is refused; the two documented exceptions
(escaped lone surrogates, integers over 64 bits) decode as the standard library decodes
them, for callers to refuse by field.
"""

from __future__ import annotations

import json
import random
import tracemalloc

import orjson
import pytest

from relay_batches.services.ingest_api.rows.scan import WINDOW_BYTES, JsonScanner, NotJson

WINDOWS = [1, 2, 3, 5, 7, 16, WINDOW_BYTES]
at_every_window = pytest.mark.parametrize("window", WINDOWS)


def scan(raw: bytes, window: int = WINDOW_BYTES) -> object:
    """The value of ``raw``, read as the submit paths read a body."""
    scanner = JsonScanner(raw, window)
    value = _walk(scanner, 0)
    if not scanner.at_end():
        raise NotJson()
    return value


def _walk(scanner: JsonScanner, depth: int) -> object:
    char = scanner.peek()
    if char == "{" and depth < 2:
        return {key: _walk(scanner, depth + 1) for key in scanner.members()}
    if char == "[" and depth < 2:
        return list(scanner.elements())
    return scanner.value()


def refused(raw: bytes, window: int = WINDOW_BYTES) -> NotJson:
    """The :class:`NotJson` of ``raw`` (anything else fails the test)."""
    with pytest.raises(NotJson) as info:
        scan(raw, window)
    return info.value


def beyond_orjson(value: object) -> bool:
    """Whether ``value`` holds what orjson refuses and the scanner keeps: an integer over
    64 bits or text UTF-8 cannot encode (a lone surrogate)."""
    if type(value) is int:
        return not -(2**63) <= value < 2**64
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(beyond_orjson(k) or beyond_orjson(v) for k, v in value.items())
    if isinstance(value, list):
        return any(beyond_orjson(v) for v in value)
    return False


SUBMIT = orjson.dumps(
    {
        "model": "gpt-4o-mini",
        "name": 'é😀\u2028 "q" \\ /',
        "priority": -3,
        "params": {"temperature": 0.25, "stop": ["\n", "x"], "seed": 12345678901234567},
        "requests": [
            {"custom_id": "a", "messages": [{"role": "user", "content": "hi"}]},
            {"messages": [{"role": "user", "content": "日本語 " * 5}], "max_tokens": 1e3},
            {"messages": [], "metadata": {"k": [True, False, None, -0.5e-7, 1.5e300]}},
        ],
    },
    option=orjson.OPT_INDENT_2,
)

VALID = [
    SUBMIT,
    b"{}",
    b"[]",
    b'{"requests": []}',
    b'  {\t"a" :\r\n[ 1 , 2 ]\n}  ',
    b'{"a": 1, "a": 2}',  # a repeated key: the last one, as json.loads
    b'"\\u00e9\\ud83d\\ude00\\/\\b\\f\\n\\r\\t\\"\\\\"',
    b"[0, -0, 0.0, -0.0, 1e2, 1E-2, 1.5e+2, 123456789012345678, -9223372036854775808]",
    b"[1e-999]",  # underflows to 0.0, as orjson reads it
    b"[true, false, null]",
    b"1234567",
    b'"a string alone"',
]


@pytest.mark.parametrize("raw", VALID)
def test_json_decodes_as_the_standard_library_does(raw: bytes) -> None:
    expected = json.loads(raw)
    assert orjson.loads(raw) == expected
    assert [scan(raw, window) for window in WINDOWS] == [expected] * len(WINDOWS)


NOT_JSON = [
    b"",
    b" \n\t ",
    b"NaN",
    b"[Infinity]",
    b'{"a": -Infinity}',
    b"[nan]",
    b"1e999",
    b"[-1E400]",
    b'{"params": {"temperature": 1e309}}',
    b"[1,]",
    b'{"a": 1,}',
    b'{"requests": [{"x": 1},]}',
    b'{"requests": [{"x": 1}],}',
    b"[,1]",
    b"[1,,2]",
    b'{"a" 1}',
    b'{"a": 1 "b": 2}',
    b"{'a': 1}",
    b"{a: 1}",
    b"[1] // comment",
    b"/* c */ [1]",
    b"\xef\xbb\xbf{}",  # a UTF-8 byte order mark
    b'["a\tb"]',  # a raw control character in a string
    b'["\x00"]',
    b'["\\x41"]',
    b'["\\u12"]',
    b'["\\u12G4"]',
    b'["\\U0041"]',
    b"[1]\x0c",  # form feed: not JSON whitespace
    b"[1]\xc2\xa0",  # no-break space: neither
    b"[01]",
    b"[-01]",
    b"[1.]",
    b"[.5]",
    b"[+1]",
    b"[0x10]",
    b"[1e]",
    b"[1e+]",
    b"[-]",
    b"[tru]",
    b"[nul]",
    b"[True]",
    b"[undefined]",
    b'{"a": 1} x',
    b'{"a": 1}{"b": 2}',
    b"[1] [2]",
    b'"a" "b"',
    b"1 2",
    b'{"a": 1',
    b'{"a": "b',
    b"[",
    b"{",
    b'"',
    b"]",
    b"}",
    b":",
    b",",
]


@pytest.mark.parametrize("raw", NOT_JSON)
@at_every_window
def test_what_is_not_strict_json_is_refused(raw: bytes, window: int) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)
    assert refused(raw, window).nested is False


INVALID_UTF8 = [
    b'["\xff"]',
    b'["\xc0\xaf"]',  # an overlong "/"
    b'["\xed\xa0\x80"]',  # a surrogate encoded as UTF-8
    b'["\xf4\x90\x80\x80"]',  # past U+10FFFF
    b'["\xe2\x82"]',  # a character cut short
    b'["\x80"]',  # a lone continuation byte
    b'{"\xff": 1}',
    b"[1]\xe2\x82",
    b"[1, \xff]",
    b'{"requests": [{"messages": [{"content": "ok \xe9"}]}]}',  # Latin-1, not UTF-8
    '["é"]'.encode("utf-16"),
]


@pytest.mark.parametrize("raw", INVALID_UTF8)
@at_every_window
def test_only_utf8_is_read(raw: bytes, window: int) -> None:
    assert refused(raw, window).nested is False


@at_every_window
def test_a_character_split_across_windows_is_read_whole(window: int) -> None:
    text = ["é", "😀", "日本", "\u2028", "a" * 3 + "😀"]
    assert scan(orjson.dumps(text), window) == text


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'"\\ud800"', "\ud800"),
        (b'"\\udc00"', "\udc00"),
        (b'"\\ud800\\u0041"', "\ud800A"),  # a high surrogate never merges with what follows
        (b'"\\udc00\\ud800"', "\udc00\ud800"),
        (b'"\\ud83d\\ude00"', "😀"),  # a pair is one character
        (b'{"\\udc00": 1}', {"\udc00": 1}),
    ],
)
@at_every_window
def test_an_escaped_lone_surrogate_is_kept_for_the_caller_to_refuse(
    raw: bytes, expected: object, window: int
) -> None:
    assert scan(raw, window) == expected == json.loads(raw)


@at_every_window
def test_huge_numbers(window: int) -> None:
    digits = "9" * 4300
    assert scan(f"[{digits}, -{digits}]".encode(), window) == [int(digits), -int(digits)]
    refused(b"[" + b"9" * 4301 + b"]", window)
    refused(b"[1" + b"0" * 400 + b".5]", window)  # a double's range, past it
    assert scan(b"[1" + b"0" * 300 + b".5]", window) == [1e300]
    assert scan(b"[0." + b"0" * 5000 + b"1]", window) == [0.0]
    assert scan(b"[1.000000000000000000000000000001]", window) == [1.0]


@at_every_window
def test_a_number_split_anywhere_is_read_whole(window: int) -> None:
    numbers = b"[1.5e-7, -0.25E+3, 12345678901234567890, 7, 0.5, 3e2, -1E-2, 100, 6.02e23]"
    for pad in range(8):  # every number meets a window edge at every offset
        raw = b" " * pad + numbers
        assert scan(raw, window) == json.loads(raw)


DEEP = 100_000


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"[" * DEEP + b"]" * DEEP, id="arrays"),
        pytest.param(b'{"a":' * DEEP + b"1" + b"}" * DEEP, id="objects"),
        pytest.param(b'[{"a":' * DEEP + b"1" + b"}]" * DEEP, id="mixed"),
        pytest.param(
            b'{"requests": [{"messages": ' + b"[" * DEEP + b"]" * DEEP + b"}]}", id="in-a-row"
        ),
        pytest.param(b'{"model": ' + b"[" * DEEP, id="unclosed"),
    ],
)
def test_deep_nesting_is_refused_in_small_memory(raw: bytes) -> None:
    tracemalloc.start()
    try:
        assert refused(raw).nested is True
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * len(raw) + 4 * 1024 * 1024, peak


def test_moderate_nesting_is_read() -> None:
    raw = b'{"requests": [{"messages": ' + b"[" * 200 + b"]" * 200 + b"}]}"
    assert scan(raw) == json.loads(raw)


@pytest.mark.parametrize("window", [1, 7, WINDOW_BYTES])
def test_a_body_cut_anywhere_is_refused(window: int) -> None:
    for cut in range(len(SUBMIT.rstrip())):
        refused(SUBMIT[:cut], window)


def test_a_corrupted_body_is_refused_or_read_as_orjson_reads_it() -> None:
    """4,000 bodies, each with one to three bytes replaced by a JSON-significant byte or
    one UTF-8 refuses; never an exception other than :class:`NotJson`."""
    alphabet = b'[]{}",:0123456789eE.+- \\utfn\xff\xc3\x80'
    rng = random.Random(26)
    outcomes = {"read": 0, "refused": 0}
    for _ in range(4_000):
        body = bytearray(SUBMIT)
        for _ in range(rng.randint(1, 3)):
            body[rng.randrange(len(body))] = rng.choice(alphabet)
        raw = bytes(body)
        try:
            expected = orjson.loads(raw)
        except orjson.JSONDecodeError:
            try:
                value = scan(raw, rng.choice(WINDOWS))
            except NotJson:
                outcomes["refused"] += 1
                continue
            assert value == json.loads(raw) and beyond_orjson(value), raw
            outcomes["read"] += 1
            continue
        assert scan(raw, rng.choice(WINDOWS)) == expected, raw
        outcomes["read"] += 1
    assert min(outcomes.values()) > 100, outcomes  # both kinds were exercised
