"""Alertmanager matcher grammar and semantics.

Quoted sentences come from Alertmanager's docs/configuration.md (section ``<matcher>``) unless stated
otherwise; "same meaning as PromQL selectors" points at Prometheus' docs/querying/basics.md.
"""

from __future__ import annotations

import pytest

from app.domain.matchers import (
    MAX_REGEX_LENGTH,
    Matcher,
    MatcherError,
    equality_value,
    matches_all,
    parse_matcher_list,
    parse_matchers,
)


def one(text: str) -> Matcher:
    (matcher,) = parse_matchers(text)
    return matcher


def triples(text: str) -> list[tuple[str, str, str]]:
    return [(m.name, m.op, m.value) for m in parse_matchers(text)]


# --- semantics ------------------------------------------------------------------------------------


def test_operators_mean_what_the_docs_say():
    # "`=` means equals, `!=` means not equal, `=~` means matches the regular expression and `!~` means
    # doesn't match the regular expression."
    labels = {"xid": "79"}
    assert one('xid="79"').matches(labels)
    assert not one('xid="48"').matches(labels)
    assert one('xid!="48"').matches(labels)
    assert not one('xid!="79"').matches(labels)
    assert one('xid=~"7."').matches(labels)
    assert not one('xid!~"7."').matches(labels)
    assert one('xid!~"4."').matches(labels)


def test_missing_label_is_the_empty_string():
    # Alertmanager evaluates `m.Matches(string(lset[name]))` (pkg/labels/matcher.go), and a maintainer on
    # prometheus/alertmanager#2968: "a silence for an empty label ... is equivalent to an non-existing label".
    assert one('foo=""').matches({"alertname": "X"})
    assert not one('foo=""').matches({"foo": "bar"})
    assert one('severity!="info"').matches({"alertname": "X"})
    assert not one('severity="info"').matches({})
    assert one('foo=~".*"').matches({})
    assert one('foo=~"|bar"').matches({})
    assert not one('foo=~".+"').matches({})
    assert one('foo!~".+"').matches({})


def test_regex_is_fully_anchored():
    # Same meaning as PromQL selectors: "Regex matches are fully anchored. A match of env=~"foo" is treated as
    # env=~"^foo$"."
    assert one('x=~"a"').matches({"x": "a"})
    assert not one('x=~"a"').matches({"x": "ab"})
    assert not one('x=~"a"').matches({"x": "ba"})
    # Python's "$" would accept a final newline; RE2's does not.
    assert not one('x=~"a"').matches({"x": "a\n"})
    assert one('x!~"a"').matches({"x": "ab"})


def test_alternation_is_anchored_as_a_whole():
    # DESIGN.md's playbook example `xid=~"79|48"`: anchoring wraps the whole alternation, ^(?:79|48)$.
    matcher = one('xid=~"79|48"')
    assert matcher.matches({"xid": "79"})
    assert matcher.matches({"xid": "48"})
    assert not matcher.matches({"xid": "479"})
    assert not matcher.matches({"xid": "791"})
    assert not matcher.matches({"xid": "79|48"})


def test_composition_ands_every_matcher():
    # "the expression {alertname="Watchdog", severity=~"warning|critical"} will match an alert with labels
    # alertname=Watchdog, severity=critical but not an alert with labels alertname=Watchdog, severity=none"
    matchers = parse_matchers('{alertname="Watchdog", severity=~"warning|critical"}')
    assert matches_all(matchers, {"alertname": "Watchdog", "severity": "critical"})
    assert not matches_all(matchers, {"alertname": "Watchdog", "severity": "none"})
    assert matches_all([], {"anything": "x"})


def test_regex_cached_and_not_part_of_equality():
    matcher = one('x=~"a+"')
    assert matcher._regex is not None
    assert matcher == Matcher("x", "=~", "a+")
    assert hash(matcher) == hash(Matcher("x", "=~", "a+"))
    assert one('x="a"')._regex is None


def test_equality_value():
    matchers = parse_matchers('alertname=~"Gpu.*", alertname!="Gpu", alertname="GpuXidError", job="x"')
    assert equality_value(matchers, "alertname") == "GpuXidError"
    assert equality_value(matchers, "job") == "x"
    assert equality_value(parse_matchers('alertname=~"GpuXidError"'), "alertname") is None
    assert equality_value([], "alertname") is None


# --- composition syntax ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        # "The open { and close } brace are optional"
        'alertname="Watchdog", severity=~"warning|critical"',
        '{alertname="Watchdog", severity=~"warning|critical"}',
        # "A single trailing comma is permitted"
        '{alertname="Watchdog", severity=~"warning|critical",}',
        'alertname="Watchdog", severity=~"warning|critical",',
        # "Whitespace (spaces, tabs and newlines) is permitted outside double quotes and has no effect"
        '{\n   alertname = "Watchdog",\n\tseverity =~ "warning|critical",\n}',
        "  alertname=Watchdog ,severity=~warning|critical  ",
    ],
)
def test_braces_commas_and_whitespace(text):
    assert triples(text) == [("alertname", "=", "Watchdog"), ("severity", "=~", "warning|critical")]


def test_empty_input_has_no_matchers():
    assert parse_matchers("") == []
    assert parse_matchers("{}") == []
    assert parse_matchers("  { }  ") == []


def test_list_entries_are_anded_and_equivalent_to_one_string():
    # "matchers: [ '{foo="bar", dings!="bums"}' ]" and "matchers: [ foo = bar, dings != bums ]" mean the same.
    one_string = parse_matcher_list(['{foo="bar", dings!="bums"}'])
    assert one_string == parse_matcher_list(["foo = bar", "dings != bums"])
    assert parse_matcher_list(['alertname="GpuXidError"', 'xid=~"79|48"']) == (
        Matcher("alertname", "=", "GpuXidError"),
        Matcher("xid", "=~", "79|48"),
    )
    assert parse_matcher_list([]) == ()


def test_list_errors_name_the_entry():
    with pytest.raises(MatcherError, match=r"^\[1\]: 4:7: unexpected bar: expected an operator"):
        parse_matcher_list(["a=b", "foo bar"])
    with pytest.raises(MatcherError, match=r"^\[0\]: expected a string, got int"):
        parse_matcher_list([42])  # type: ignore[list-item]
    with pytest.raises(MatcherError, match="expected a list of matcher strings, got a single string"):
        parse_matcher_list("a=b")


# --- quoting and escapes --------------------------------------------------------------------------


def test_unquoted_literals():
    # "`foo`, `[a-zA-Z]+`, and `Προμηθεύς` (Prometheus in Greek) are all examples of valid unquoted literals."
    assert triples("name=foo") == [("name", "=", "foo")]
    assert triples("name=~[a-zA-Z]+") == [("name", "=~", "[a-zA-Z]+")]
    assert triples("Προμηθεύς=Προμηθεύς") == [("Προμηθεύς", "=", "Προμηθεύς")]


def test_double_quoted_strings():
    # "For example, "foo!", "bar,baz", "\"baz qux\"" and "\xf0\x9f\x99\x82"."
    assert one('x="foo!"').value == "foo!"
    assert one('x="bar,baz"').value == "bar,baz"
    assert one(r'x="\"baz qux\""').value == '"baz qux"'
    assert one(r'x="\xf0\x9f\x99\x82"').value == "🙂"
    # "to match the regular expression \d+ the backslash must be escaped "\\d+""
    assert one(r'x=~"\\d+"').value == r"\d+"
    # Quoted names may hold reserved characters.
    assert one('"foo bar"="x"').name == "foo bar"


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        (r'"a\tb"', "a\tb"),
        (r'"a\nb"', "a\nb"),
        (r'"\\"', "\\"),
        (r'"\""', '"'),
        (r'"\x41"', "A"),
        (r'"\u00e9"', "é"),
        (r'"\U0001F642"', "🙂"),
        (r'"\101"', "A"),
        (r'"\a\b\f\r\v"', "\a\b\f\r\v"),
        ('"raw\ttab"', "raw\ttab"),
    ],
)
def test_go_escapes(literal, value):
    assert one(f"x={literal}").value == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (r'"\q"="x"', r'^0:4: "\\q": invalid input \(unknown escape \\q\)$'),
        (r'"x"="\x4"', r"invalid input \(\\x needs 2 hex digits\)"),
        (r'"x"="\ud800"', r"invalid input \(\\ud800 is not a valid code point\)"),
        (r'"x"="\400"', r"invalid input \(octal escape needs 3 digits up to \\377\)"),
        (r'"x"="\xff"', r"invalid input \(not valid UTF-8\)"),
        ('"a\nb"="x"', r"invalid input \(newline in quoted string\)"),
    ],
)
def test_bad_quoted_strings(text, message):
    # A quoted name keeps the classic grammar from reading these (it would take the backslash literally).
    with pytest.raises(MatcherError, match=message):
        parse_matchers(text)


# --- classic fallback -----------------------------------------------------------------------------


def test_classic_fallback_empty_value():
    # "the matcher `foo=` can be made into a valid UTF-8 matcher by double quoting the right hand side of the
    # expression to give `foo=""`. These two matchers are equivalent"
    assert parse_matchers("foo=") == parse_matchers('foo=""')


def test_classic_fallback_keeps_single_backslashes():
    # Classic: "single \ characters not followed by \, n, or " ... act as a literal backslash in that case."
    assert one(r'x=~"\d+"').value == r"\d+"
    assert one(r"x=~\d+").value == r"\d+"
    assert one('x=~"a\\.b"').value == r"a\.b"
    assert one(r"x=~\w+\.gpu").matches({"x": "node1.gpu"})


def test_classic_fallback_values_with_spaces_and_line_feeds():
    # Classic: "A UTF-8 string, which may be enclosed in double quotes"; "literal line feed characters are
    # tolerated".
    assert one("summary=GPU fell off the bus").value == "GPU fell off the bus"
    assert one('x="a\nb"').value == "a\nb"
    assert triples('{foo = bar baz, dings != "bums, too" ,}') == [
        ("foo", "=", "bar baz"),
        ("dings", "!=", "bums, too"),
    ]


def test_classic_fallback_openmetrics_escapes():
    # Classic: "Within the 3rd token, OpenMetrics escaping rules apply: \" for a double-quote, \n for a line
    # feed, \\ for a literal backslash."
    assert one(r'x="a\"b\nc\\d\e"').value == 'a"b\nc\\d\\e'


def test_both_braces_or_none_even_in_the_classic_grammar():
    # "both must be either present or omitted. You cannot have incomplete open or close braces";
    # Alertmanager's classic parser would trim a lone brace and read x=~a{2} as "a{2".
    with pytest.raises(MatcherError, match=r"^4:5: unexpected \{: expected a comma or close brace$"):
        parse_matchers("x=~a{2}")
    with pytest.raises(MatcherError, match=r"^9:12: unexpected baz: expected a comma or close brace$"):
        parse_matchers("{foo=bar baz")
    assert triples("{foo=bar baz}") == [("foo", "=", "bar baz")]


def test_utf8_reading_wins_when_both_grammars_accept():
    # Alertmanager's fallback keeps the classic reading (backslash, t); its utf8-strict mode and we decode.
    assert one(r'x="a\tb"').value == "a\tb"


# --- error messages -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("foo bar", "4:7: unexpected bar: expected an operator such as '=', '!=', '=~' or '!~'"),
        ("a=b,c", "5:5: unexpected end of input: expected an operator such as '=', '!=', '=~' or '!~'"),
        (",", "0:1: unexpected ,: expected label name"),
        ("{{a=b}}", "1:2: unexpected {: expected label name"),
        ('a=b c="d"', "4:5: unexpected c: expected a comma or close brace"),
        ("a=b,,", "4:5: unexpected ,: expected a matcher or close brace after comma"),
        ('{foo="bar"', "10:10: unexpected end of input: expected close brace"),
        ('foo="bar"}', "9:10: unexpected }: expected opening brace"),
        ('{a="b"}}', "7:8: unexpected }: expected end of input"),
        ('{a="b"} c', "8:9: unexpected c: expected end of input"),
        ('"a"=,', "4:5: unexpected ,: expected label value"),
        ("foo!bar", "3:4: !: expected '!=' or '!~'"),
        ("foo!", "3:4: !: expected '!=' or '!~'"),
        ('foo="bar', '4:8: "bar: missing end "'),
        ("foo`=1", "3:4: `: invalid input"),
        ('""="x"', "label name must not be empty"),
    ],
)
def test_error_messages(text, message):
    with pytest.raises(MatcherError) as info:
        parse_matchers(text)
    assert str(info.value) == message


def test_not_a_string():
    with pytest.raises(MatcherError, match="expected a string, got NoneType"):
        parse_matchers(None)  # type: ignore[arg-type]


def test_matcher_constructor_validates():
    with pytest.raises(MatcherError, match="unknown operator '=='"):
        Matcher("a", "==", "b")
    with pytest.raises(MatcherError, match="label name must not be empty"):
        Matcher("", "=", "b")
    with pytest.raises(MatcherError, match="must be strings"):
        Matcher("a", "=", 1)  # type: ignore[arg-type]
    with pytest.raises(MatcherError, match="lone surrogate"):
        Matcher("a", "=", "\ud800")


# --- RE2 regular expressions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("regex", "reason"),
    [
        (r"(a)\1", r"backreference \\1 is not supported"),
        ("a(?=b)", "lookaround assertions are not supported"),
        ("a(?!b)", "lookaround assertions are not supported"),
        ("(?<=a)b", "lookaround assertions are not supported"),
        ("(?<!a)b", "lookaround assertions are not supported"),
        ("(?>a)", r"unsupported group syntax '\(\?>'"),
        ("(?P=n)", r"unsupported group syntax '\(\?P'"),
        ("(?#c)", r"unsupported group syntax"),
        ("a*+", r"invalid nested repetition operator \*\+"),
        ("a++", r"invalid nested repetition operator \+\+"),
        ("a?+", r"invalid nested repetition operator \?\+"),
        ("a{2}+", r"invalid nested repetition operator \{2\}\+"),
        ("a**", r"invalid nested repetition operator"),
        (r"a\Z", r"invalid escape sequence \\Z"),
        (r"\u00e9", r"invalid escape sequence \\u"),
        (r"\pL", r"Unicode classes \\p are not supported"),
        (r"\é", r"invalid escape sequence \\é"),
        ("(?U)a*", "flag U"),
        ("(?x)a", "unknown flag"),
        ("(?i-)a", "missing flag"),
        ("a{1001}", r"invalid repeat count \{1001\}"),
        ("a{3,2}", r"invalid repeat count \{3,2\}"),
        ("a)|(b", r"unexpected \) at position 1"),
        ("(a", r"missing closing \)"),
        ("[a", r"missing closing \]"),
        ("[[:nope:]]", r"invalid character class \[:nope:\]"),
        ("[[:[:word:]]", r"invalid character class \[:\[:word:\]"),  # "[:" runs to the first ":]"
        ("[--+]", "invalid character class range --\\+"),
        (r"[a-\d]", r"invalid escape sequence \\d"),
        (r"\8", r"backreference \\8"),
        (r"\C", r"invalid escape sequence \\C"),
        (r"\x{110000}", r"invalid escape sequence"),
        ("(?-)a", "missing flag"),
        ("[\\b]", r"invalid escape sequence \\b"),
        ("a\\", "trailing backslash"),
        (r"\Qa.b", r"\\Q without \\E"),
        ("*a", "nothing to repeat"),
    ],
)
def test_regex_rejected_when_not_re2(regex, reason):
    with pytest.raises(MatcherError, match=r"^invalid regular expression in matcher x=~.*: " + reason):
        Matcher("x", "=~", regex)


def test_invalid_regex_error_names_the_matcher():
    with pytest.raises(MatcherError) as info:
        parse_matchers('xid=~"(79"')
    assert str(info.value) == 'invalid regular expression in matcher xid=~"(79": missing closing )'


def test_regex_length_is_bounded():
    Matcher("x", "=~", "a" * MAX_REGEX_LENGTH)
    with pytest.raises(MatcherError, match="expression of 1025 characters exceeds the limit of 1024"):
        Matcher("x", "!~", "a" * (MAX_REGEX_LENGTH + 1))
    Matcher("x", "=", "a" * 10 * MAX_REGEX_LENGTH)  # plain values are not regexes


@pytest.mark.parametrize(
    ("regex", "matching", "not_matching"),
    [
        (r"\d+", ["0", "123"], ["", "1a", "\u0661"]),  # RE2 \d is ASCII (U+0661 ARABIC-INDIC ONE)
        (r"\w+", ["a_1"], ["é", "a-b"]),
        (r"a\z", ["a"], ["a\n"]),
        ("a$", ["a"], ["a\n"]),
        ("(?i)gpu", ["GPU", "gpu", "Gpu"], ["gpux"]),
        ("a(?i)b|c", ["ab", "aB", "C"], ["AB", "ac"]),  # flags last to the end of the group, across "|"
        ("(a(?i)b)c", ["aBc"], ["aBC"]),
        ("(?i:a)b", ["Ab"], ["AB"]),
        ("(?s:.)", ["\n"], []),
        (".", ["x"], ["\n"]),
        ("(?m)a$\nb", ["a\nb"], []),
        ("(?P<n>a)(?<m>b)", ["ab"], []),
        ("[[:alpha:]]+[[:digit:]]", ["ab1"], ["1a"]),
        ("[[:punct:]]", ["!", "[", "`", "~"], ["a"]),
        (r"\s", [" ", "\t"], ["\v", "x"]),
        (r"\S", ["x"], [" ", "\t"]),
        (r"[\s]", ["\n"], ["\v"]),
        (r"\QA.B*\E", ["A.B*"], ["AxB"]),
        (r"\x{1F642}", ["🙂"], []),
        ("[\\x{41}-C]", ["B"], ["D"]),
        (r"\x41", ["A"], []),
        ("a{,2}", ["a{,2}"], ["a", "aa"]),  # RE2 reads "{,2}" literally; Python would repeat
        ("a{2,}", ["aa", "aaaa"], ["a"]),
        ("a{2,3}?", ["aa", "aaa"], ["a"]),
        ("x{", ["x{"], []),
        ("[]a]", ["]", "a"], ["b"]),
        ("[^]a]", ["b"], ["]", "a"]),
        ("[a[]", ["["], ["]"]),
        ("[a&&b]", ["&"], ["c"]),
        ("[+--]", [",", "-"], ["a"]),
        (r"\.\*", [".*"], ["ab"]),
        ("", [""], ["a"]),
        ("a|", ["a", ""], ["b"]),
        ("[[:^alpha:]]", ["1", "é", "-"], ["a", "Z"]),
        (r"[^\D]", ["7"], ["a"]),
        (r"[\W]", ["-", "é"], ["a", "_"]),
        ("[[:word:]-]+", ["a-b_1"], ["a.b"]),
        ("[[:]", ["[", ":"], ["]"]),  # no ":]" follows, so "[:" is literal
        ("(?)a", ["a"], ["A"]),  # an empty flag group sets nothing, as in Go
        (r"\12\0", ["\n\x00"], []),  # octal escapes
        (r"\bgpu\b", ["gpu"], ["gpus"]),
        (r"a\b-", ["a-"], ["a"]),
        (r"\B", [""], ["a"]),  # RE2: no word boundary in the empty string (Python's \B never matches it)
        (r"a\Bb", ["ab"], ["a-b"]),
        ("(?i)é", ["É", "é"], ["e"]),  # RE2 folds case over Unicode
        (r"\Ax", ["x"], []),
    ],
)
def test_re2_semantics(regex, matching, not_matching):
    matcher = Matcher("x", "=~", regex)
    for value in matching:
        assert matcher.matches({"x": value}), value
    for value in not_matching:
        assert not matcher.matches({"x": value}), value


# --- canonical form -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("matcher", "text"),
    [
        (Matcher("alertname", "=", "GpuXidError"), 'alertname="GpuXidError"'),
        (Matcher("xid", "=~", "79|48"), 'xid=~"79|48"'),
        (Matcher("a", "!=", 'say "hi"\\'), r'a!="say \"hi\"\\"'),
        (Matcher("a", "!~", "\\d+\n"), r'a!~"\\d+\n"'),
        (Matcher("a", "=", "tab\there\x00\x7f\u00a0\u2028🙂é"), r'a="tab\there\x00\x7f\u00a0\u2028🙂é"'),
        (Matcher("foo bar", "=", "x"), r'"foo bar"="x"'),
        (Matcher("a\tb", "=", ""), r'"a\tb"=""'),
        (Matcher("Προμηθεύς", "=", ""), 'Προμηθεύς=""'),
        (Matcher("a", "=", "\U000e0001"), r'a="\U000e0001"'),
    ],
)
def test_canonical_form_round_trips(matcher, text):
    assert str(matcher) == text
    assert parse_matchers(str(matcher)) == [matcher]
