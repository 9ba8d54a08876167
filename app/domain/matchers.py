"""Alertmanager label matchers: the grammar, the semantics and RE2-compatible regular expressions.

A matcher is ``name op value`` with ``op`` one of ``=``, ``!=``, ``=~``, ``!~``. Semantics follow Alertmanager
(``pkg/labels/matcher.go``): a label missing from an alert is the empty string, regular expressions are fully
anchored (``^(?:value)$``) and every matcher of a list must hold.

Parsing follows Alertmanager's default "fallback" mode (``matcher/compat/parse.go``): the UTF-8 grammar
(``matcher/parse``) first, and when it rejects the input, the classic grammar (``pkg/labels/parse.go``). Two
deliberate differences, both stricter or clearer than Alertmanager:

- When both grammars accept an input but read it differently (a quoted value with a Go escape other
  than ``\\"``, ``\\\\`` and ``\\n``, e.g. ``"\\t"`` or ``"\\x41"``), Alertmanager's fallback mode keeps
  the classic reading; we keep the UTF-8 reading, as Alertmanager's ``utf8-strict-mode`` (its announced
  future default) does. A regex escape written with a doubled backslash (``"\\\\b"``) means the same in
  every mode.
- Braces must balance in both grammars (the classic parser trims a lone ``{`` or ``}``, which turns
  ``x=~a{2}`` into ``a{2``).

Regular expressions must be valid RE2; they are translated to Python's ``re`` (see :func:`_re2_to_python`).
Not supported: Unicode classes (``\\pL``). Python backtracks where RE2 does not, so a pathological pattern
(``(a+)+b``) is slow on long values; patterns come from reviewed playbooks, not from alerts.

Error positions are ``start:end`` rune columns of the offending token, 0-based with ``end`` exclusive, as
Alertmanager prints them.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

OPERATORS = ("=", "!=", "=~", "!~")
MAX_REGEX_LENGTH = 1024


class MatcherError(ValueError):
    """A matcher string or value is invalid; the message says what and where."""


@dataclass(frozen=True)
class Matcher:
    """One ``name op value`` test on an alert's labels. Construction validates (and compiles a regex once)."""

    name: str
    op: str
    value: str
    _regex: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not isinstance(self.value, str):
            raise MatcherError("label name and value must be strings")
        if self.op not in OPERATORS:
            raise MatcherError(f"unknown operator {self.op!r} (expected one of {', '.join(OPERATORS)})")
        if not self.name:
            raise MatcherError("label name must not be empty")
        if _SURROGATE.search(self.name + self.value):
            raise MatcherError(f"matcher {_show(self.name)}: not valid UTF-8 (lone surrogate)")
        if self.op in ("=~", "!~"):
            object.__setattr__(self, "_regex", self._compile())

    def _compile(self) -> re.Pattern[str]:
        if len(self.value) > MAX_REGEX_LENGTH:
            raise MatcherError(
                f"matcher {_show(self.name)}{self.op}: regular expression of {len(self.value)} characters "
                f"exceeds the limit of {MAX_REGEX_LENGTH}"
            )
        try:
            # Alertmanager compiles "^(?:" + v + ")$" with Go's RE2, where "$" is the end of the text;
            # Python's "$" also matches before a final newline, hence \Z.
            return re.compile(f"^(?:{_re2_to_python(self.value)})\\Z")
        except re.error as exc:
            reason = exc.msg
        except (ValueError, RecursionError, OverflowError) as exc:
            reason = str(exc)
        raise MatcherError(f"invalid regular expression in matcher {_show(str(self))}: {reason}")

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this matcher; a missing label counts as the empty string."""
        actual = labels.get(self.name, "")
        if self._regex is None:
            return (actual == self.value) == (self.op == "=")
        return (self._regex.match(actual) is not None) == (self.op == "=~")

    def __str__(self) -> str:
        """Canonical form ``name="value"``, Go-quoted, such that ``parse_matchers(str(m)) == [m]``."""
        name = (
            _go_quote(self.name)
            if any(_is_reserved(c) or not c.isprintable() for c in self.name)
            else self.name
        )
        return f"{name}{self.op}{_go_quote(self.value)}"


def parse_matchers(text: str) -> list[Matcher]:
    """Parse one string holding zero or more comma-separated matchers, optionally inside ``{...}``.

    Raises :class:`MatcherError`. When neither grammar accepts the input, the UTF-8 grammar's error is
    reported, since it carries a position.
    """
    if not isinstance(text, str):
        raise MatcherError(f"expected a string, got {type(text).__name__}")
    try:
        return [Matcher(*triple) for triple in _parse_utf8(text)]
    except MatcherError:
        classic = _parse_classic(text)
        if classic is None:
            raise
    return [Matcher(*triple) for triple in classic]


def parse_matcher_list(items: Sequence[str]) -> tuple[Matcher, ...]:
    """Parse a list of matcher strings (a route's ``matchers:``); the results are ANDed.

    Errors are prefixed with the entry's index, e.g. ``[1]: 4:7: unexpected bar: ...``.
    """
    if isinstance(items, str):
        raise MatcherError("expected a list of matcher strings, got a single string")
    out: list[Matcher] = []
    for index, item in enumerate(items):
        try:
            out.extend(parse_matchers(item))
        except MatcherError as exc:
            raise MatcherError(f"[{index}]: {exc}") from None
    return tuple(out)


def matches_all(matchers: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    """Whether every matcher holds for ``labels`` (true for no matchers)."""
    return all(m.matches(labels) for m in matchers)


def equality_value(matchers: Iterable[Matcher], name: str) -> str | None:
    """The value of the first positive ``=`` matcher on ``name``, or None (for indexing by alertname)."""
    return next((m.value for m in matchers if m.name == name and m.op == "="), None)


# --- UTF-8 grammar (matcher/parse): lexer ---------------------------------------------------------

# Go's unicode.IsSpace: Latin-1 spaces plus the White_Space code points above U+00FF.
_SPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B)))
)
_RESERVED = frozenset("{}!=~,\\\"'`")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _is_reserved(char: str) -> bool:
    return char in _SPACE or char in _RESERVED


@dataclass(frozen=True)
class _Token:
    kind: str  # "{", "}", ",", an operator, "quoted", "unquoted" or "eof"
    text: str
    start: int
    end: int


def _scan(text: str) -> Iterator[_Token]:
    """Yield tokens lazily: a lexical error surfaces only when the parser reaches it (as in Alertmanager)."""
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char in _SPACE:
            i += 1
        elif char in "{},":
            yield _Token(char, char, i, i + 1)
            i += 1
        elif char in "=!":
            follow = text[i + 1 : i + 2]
            if char == "=":
                op = "=~" if follow == "~" else "="
            elif follow in ("=", "~"):
                op = "!" + follow
            else:
                raise MatcherError(f"{i}:{i + 1}: !: expected '!=' or '!~'")
            yield _Token(op, op, i, i + len(op))
            i += len(op)
        elif char == '"':
            end = _closing_quote(text, i)
            if end is None:
                raise MatcherError(f'{i}:{n}: {text[i:]}: missing end "')
            yield _Token("quoted", text[i : end + 1], i, end + 1)
            i = end + 1
        elif char in _RESERVED:
            raise MatcherError(f"{i}:{i + 1}: {char}: invalid input")
        else:
            start = i
            while i < n and not _is_reserved(text[i]):
                i += 1
            yield _Token("unquoted", text[start:i], start, i)
    yield _Token("eof", "", n, n)


def _closing_quote(text: str, start: int) -> int | None:
    """Index of the unescaped ``"`` closing the string opened at ``start``, or None."""
    escaped = False
    for i in range(start + 1, len(text)):
        char = text[i]
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            return i
    return None


# --- UTF-8 grammar: parser ------------------------------------------------------------------------


class _Tokens:
    """One-token lookahead over :func:`_scan`."""

    def __init__(self, text: str):
        self._iter = _scan(text)
        self._next: _Token | None = None

    def peek(self) -> _Token:
        if self._next is None:
            self._next = next(self._iter)
        return self._next

    def take(self) -> _Token:
        token = self.peek()
        if token.kind != "eof":
            self._next = None
        return token


def _unexpected(token: _Token, expected: str) -> MatcherError:
    what = "end of input" if token.kind == "eof" else token.text
    return MatcherError(f"{token.start}:{token.end}: unexpected {what}: {expected}")


def _parse_utf8(text: str) -> list[tuple[str, str, str]]:
    """``['{'] [matcher (',' matcher)* [',']] ['}']`` with both braces or neither."""
    tokens = _Tokens(text)
    triples: list[tuple[str, str, str]] = []
    has_open = tokens.peek().kind == "{"
    if has_open:
        tokens.take()
    if tokens.peek().kind not in ("}", "eof"):
        while True:
            triples.append(_parse_one(tokens))
            token = tokens.peek()
            if token.kind == ",":
                tokens.take()
                token = tokens.peek()
                if token.kind in ("}", "eof"):
                    break
                if token.kind not in ("quoted", "unquoted"):
                    raise _unexpected(token, "expected a matcher or close brace after comma")
            elif token.kind in ("}", "eof"):
                break
            else:
                raise _unexpected(token, "expected a comma or close brace")
    token = tokens.take()
    if has_open and token.kind != "}":
        raise _unexpected(token, "expected close brace")
    if not has_open and token.kind == "}":
        raise _unexpected(token, "expected opening brace")
    if has_open:
        token = tokens.take()
    if token.kind != "eof":
        raise _unexpected(token, "expected end of input")
    return triples


def _parse_one(tokens: _Tokens) -> tuple[str, str, str]:
    name = tokens.take()
    if name.kind not in ("quoted", "unquoted"):
        raise _unexpected(name, "expected label name")
    op = tokens.take()
    if op.kind not in OPERATORS:
        raise _unexpected(op, "expected an operator such as '=', '!=', '=~' or '!~'")
    value = tokens.take()
    if value.kind not in ("quoted", "unquoted"):
        raise _unexpected(value, "expected label value")
    return _token_text(name), op.kind, _token_text(value)


def _token_text(token: _Token) -> str:
    if token.kind == "unquoted":
        return token.text
    try:
        return _go_unquote(token.text)
    except ValueError as exc:
        raise MatcherError(f"{token.start}:{token.end}: {token.text}: invalid input ({exc})") from None


# Go string-literal escapes (RE2 shares them but for \b, its word boundary).
_GO_ESCAPES = {
    "a": 0x07,
    "b": 0x08,
    "f": 0x0C,
    "n": 0x0A,
    "r": 0x0D,
    "t": 0x09,
    "v": 0x0B,
    "\\": 0x5C,
    '"': 0x22,
}
_QUOTE_ESCAPES = {chr(code): "\\" + letter for letter, code in _GO_ESCAPES.items()}
_HEX = frozenset("0123456789abcdefABCDEF")
_OCTAL = frozenset("01234567")
_MAX_RUNE = 0x10FFFF


def _go_unquote(literal: str) -> str:
    """Decode a Go double-quoted string literal (strconv.Unquote); the result must be valid UTF-8."""
    body = literal[1:-1]
    if "\n" in body:
        raise ValueError("newline in quoted string")
    buf = bytearray()
    i = 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            buf += char.encode("utf-8", "surrogatepass")
            i += 1
            continue
        kind = body[i + 1]  # the lexer guarantees a character after a backslash
        if kind in _GO_ESCAPES:
            buf.append(_GO_ESCAPES[kind])
            i += 2
        elif kind in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[kind]
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width or not set(digits) <= _HEX:
                raise ValueError(f"\\{kind} needs {width} hex digits")
            code = int(digits, 16)
            if kind == "x":
                buf.append(code)
            elif code > _MAX_RUNE or 0xD800 <= code <= 0xDFFF:
                raise ValueError(f"\\{kind}{digits} is not a valid code point")
            else:
                buf += chr(code).encode()
            i += 2 + width
        elif kind in _OCTAL:
            digits = body[i + 1 : i + 4]
            if len(digits) != 3 or not set(digits) <= _OCTAL or int(digits, 8) > 255:
                raise ValueError("octal escape needs 3 digits up to \\377")
            buf.append(int(digits, 8))
            i += 4
        else:
            raise ValueError(f"unknown escape \\{kind}")
    try:
        return buf.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not valid UTF-8") from None


def _go_quote(text: str) -> str:
    """Quote like Go's strconv.Quote: escapes for quotes, backslashes and every non-printable character."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in _QUOTE_ESCAPES:
            out.append(_QUOTE_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


# --- classic grammar (pkg/labels/parse.go), used when the UTF-8 grammar rejects the input ---------

# Go's regexp "\s" is [\t\n\f\r ]. The original ends with a lazy value and "\s*$"; stripping trailing space
# first and matching greedily gives the same result without quadratic backtracking.
_CLASSIC_SPACE = "\t\n\f\r "
_CLASSIC = re.compile(
    r"[\t\n\f\r ]*([a-zA-Z_:][a-zA-Z0-9_:]*)[\t\n\f\r ]*(=~|=|!=|!~)[\t\n\f\r ]*(.*)", re.DOTALL
)


def _parse_classic(text: str) -> list[tuple[str, str, str]] | None:
    """The classic reading of ``text``, or None when the classic grammar rejects it too."""
    has_open, has_close = text.startswith("{"), text.endswith("}")
    if has_open != has_close:
        return None
    body = text[1:-1] if has_open else text
    parts = _split_classic(body)
    # As in Alertmanager, only the last part is trimmed and dropped when empty (one trailing comma allowed).
    last = parts.pop().strip("".join(_SPACE))
    if last:
        parts.append(last)
    triples = []
    for part in parts:
        triple = _classic_one(part)
        if triple is None:
            return None
        triples.append(triple)
    return triples


def _split_classic(body: str) -> list[str]:
    """Split on commas outside double quotes; a backslash-escaped quote does not open or close a quote."""
    parts: list[str] = []
    current: list[str] = []
    inside = escaped = False
    for char in body:
        if char == "," and not inside:
            parts.append("".join(current))
            current = []
            continue
        if char == '"':
            if escaped:
                escaped = False
            else:
                inside = not inside
        elif char == "\\":
            escaped = not escaped
        else:
            escaped = False
        current.append(char)
    parts.append("".join(current))
    return parts


def _classic_one(text: str) -> tuple[str, str, str] | None:
    match = _CLASSIC.fullmatch(text.rstrip(_CLASSIC_SPACE))
    if match is None:
        return None
    name, op, raw = match.groups()
    quoted = raw.startswith('"')
    if quoted:
        raw = raw[1:]
    value: list[str] = []
    escaped = False
    for i, char in enumerate(raw):
        if escaped:
            escaped = False
            # OpenMetrics escapes; any other "\x" is a literal backslash followed by x.
            value.append({"n": "\n", '"': '"', "\\": "\\"}.get(char, "\\" + char))
        elif char == "\\":
            if i < len(raw) - 1:
                escaped = True
            else:
                value.append("\\")
        elif char == '"':
            if not quoted or i < len(raw) - 1:
                return None
            quoted = False
        else:
            value.append(char)
    if quoted:
        return None
    return name, op, "".join(value)


# --- RE2 -> Python regular expressions ------------------------------------------------------------

_REPEAT = re.compile(r"\{([0-9]+)(,([0-9]*))?\}")
_FLAG_GROUP = re.compile(r"\(\?([A-Za-z]*)(?:-([A-Za-z]*))?([:)])")
_MAX_REPEAT = 1000

# Character classes as sorted code point ranges: RE2's Perl classes are ASCII-only, unlike Python's.
_Ranges = tuple[tuple[int, int], ...]
_DIGIT: _Ranges = ((0x30, 0x39),)
_WORD: _Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_PERL_CLASSES: dict[str, _Ranges] = {"d": _DIGIT, "s": ((0x09, 0x0A), (0x0C, 0x0D), (0x20, 0x20)), "w": _WORD}
_POSIX_CLASSES: dict[str, _Ranges] = {
    "alnum": ((0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A)),
    "alpha": ((0x41, 0x5A), (0x61, 0x7A)),
    "ascii": ((0x00, 0x7F),),
    "blank": ((0x09, 0x09), (0x20, 0x20)),
    "cntrl": ((0x00, 0x1F), (0x7F, 0x7F)),
    "digit": _DIGIT,
    "graph": ((0x21, 0x7E),),
    "lower": ((0x61, 0x7A),),
    "print": ((0x20, 0x7E),),
    "punct": ((0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60), (0x7B, 0x7E)),
    "space": ((0x09, 0x0D), (0x20, 0x20)),
    "upper": ((0x41, 0x5A),),
    "word": _WORD,
    "xdigit": ((0x30, 0x39), (0x41, 0x46), (0x61, 0x66)),
}


@dataclass
class _Group:
    """A group being translated: scoped flag groups opened by ``(?flags)`` in it, and whether ``m`` is on."""

    multiline: bool
    reopen: list[str] = field(default_factory=list)


def _re2_to_python(pattern: str) -> str:
    """Translate an RE2 pattern (Go's regexp syntax) into an equivalent Python ``re`` pattern.

    Raises ValueError for what RE2 rejects but Python would accept (backreferences, lookaround, atomic groups,
    possessive quantifiers, ``\\Z``...), for RE2 features Python lacks (``\\pL``), and, stricter than Go, for
    an unbalanced ``)`` (Go accepts it only because Alertmanager wraps the pattern in ``^(?:...)$``) and for
    a repetition of a flag group or an empty-width assertion (``a(?i)*``, ``^*``). Classes (``\\d``,
    ``[[:alpha:]]``, ``\\b``) are spelled out as RE2's ASCII sets, so ``(?i)`` folds case over Unicode in both.
    """
    out: list[str] = []
    groups = [_Group(multiline=False)]
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if char == "\\":
            piece, i = _escape(pattern, i)
            out.append(piece)
        elif char == "[":
            piece, i = _char_class(pattern, i)
            out.append(piece)
        elif char == "(":
            i = _open_group(pattern, i, groups, out)
        elif char == ")":
            if len(groups) == 1:
                raise ValueError(f"unexpected ) at position {i}")
            out.append(")" * (len(groups.pop().reopen) + 1))
            i += 1
        elif char == "|":
            # RE2 flags set by "(?i)" last to the end of the group, across alternatives; Python's scoped
            # "(?i:...)" must therefore be closed before "|" and reopened after it.
            reopen = groups[-1].reopen
            out.append(")" * len(reopen) + "|" + "".join(reopen))
            i += 1
        elif char == "$":
            out.append("$" if groups[-1].multiline else "\\Z")
            i += 1
        elif char in "*+?" or (char == "{" and _REPEAT.match(pattern, i)):
            piece, i = _repetition(pattern, i)
            out.append(piece)
        else:
            # A "{" that starts no valid repeat is literal in RE2; Python would read "{,n}" as one.
            out.append("\\{" if char == "{" else char)
            i += 1
    if len(groups) > 1:
        raise ValueError("missing closing )")
    out.append(")" * len(groups[0].reopen))
    return "".join(out)


def _open_group(pattern: str, i: int, groups: list[_Group], out: list[str]) -> int:
    current = groups[-1]
    if not pattern.startswith("(?", i):
        groups.append(_Group(current.multiline))
        out.append("(")
        return i + 1
    if pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
        raise ValueError("lookaround assertions are not supported (RE2)")
    for opener in ("(?P<", "(?<"):
        if pattern.startswith(opener, i):
            groups.append(_Group(current.multiline))
            out.append("(?P<")
            return i + len(opener)
    match = _FLAG_GROUP.match(pattern, i)
    if match is None:
        raise ValueError(f"unsupported group syntax {pattern[i : i + 3]!r} (RE2)")
    on, off, end = match.group(1), match.group(2), match.group(3)
    flags = on + (off or "")
    if "U" in flags:
        raise ValueError("flag U (ungreedy) is not supported")
    if set(flags) - set("ims"):
        raise ValueError(f"unknown flag in {match.group(0)!r}")
    if off == "":
        raise ValueError(f"missing flag in {match.group(0)!r}")
    multiline = ("m" in on or current.multiline) and "m" not in (off or "")
    opener = f"(?{on}{'-' + off if off else ''}:"
    if end == ":":
        groups.append(_Group(multiline))
        out.append(opener)
    elif flags:  # "(?)" sets nothing, as in Go
        current.reopen.append(opener)
        current.multiline = multiline
        out.append(opener)
    return match.end()


def _repetition(pattern: str, i: int) -> tuple[str, int]:
    if pattern[i] == "{":
        match = _REPEAT.match(pattern, i)
        assert match is not None  # the caller checked
        low, high = int(match.group(1)), match.group(3)
        top = low if match.group(2) is None else (int(high) if high else None)
        if low > _MAX_REPEAT or (top is not None and (top > _MAX_REPEAT or top < low)):
            raise ValueError(f"invalid repeat count {match.group(0)}")
        piece, i = match.group(0), match.end()
    else:
        piece, i = pattern[i], i + 1
    if pattern.startswith("?", i):
        piece, i = piece + "?", i + 1
    if i < len(pattern) and (pattern[i] in "*+?" or (pattern[i] == "{" and _REPEAT.match(pattern, i))):
        raise ValueError(f"invalid nested repetition operator {piece}{pattern[i]}")
    return piece, i


def _escape(pattern: str, i: int) -> tuple[str, int]:
    """Translate the escape at ``pattern[i]`` (outside a class); return the Python text and the next index."""
    kind = pattern[i + 1 : i + 2]
    if kind == "Q":
        end = pattern.find("\\E", i + 2)
        if end < 0:
            # RE2 would read the rest as literal, but Alertmanager's wrapping ")$" then becomes part of it
            # and the pattern never compiles there.
            raise ValueError("\\Q without \\E")
        return "".join(_literal(ord(c)) for c in pattern[i + 2 : end]), end + 2
    if kind == "z":
        return "\\Z", i + 2
    if kind == "A":
        return "\\A", i + 2
    if kind in ("b", "B"):
        word = f"[{_class_body(_WORD)}]"
        inside, outside = (f"(?!{word})", f"(?={word})") if kind == "b" else (f"(?={word})", f"(?!{word})")
        return f"(?:(?<={word}){inside}|(?<!{word}){outside})", i + 2
    if kind and kind.lower() in _PERL_CLASSES:
        return f"[{'^' if kind.isupper() else ''}{_class_body(_PERL_CLASSES[kind.lower()])}]", i + 2
    if kind in ("1", "2", "3", "4", "5", "6", "7", "8", "9") and pattern[i + 2 : i + 3] not in _OCTAL:
        raise ValueError(f"backreference \\{kind} is not supported (RE2)")
    code, i = _escaped_char(pattern, i)
    return _literal(code), i


def _escaped_char(pattern: str, i: int) -> tuple[int, int]:
    """The code point of a single-character escape at ``pattern[i] == '\\\\'`` (Go's parseEscape)."""
    if i + 1 >= len(pattern):
        raise ValueError("trailing backslash")
    kind = pattern[i + 1]
    if kind in _OCTAL and (kind == "0" or pattern[i + 2 : i + 3] in _OCTAL):
        end = i + 2
        while end < min(i + 4, len(pattern)) and pattern[end] in _OCTAL:
            end += 1
        return int(pattern[i + 1 : end], 8), end
    if kind == "x":
        if pattern.startswith("{", i + 2):
            end = pattern.find("}", i + 3)
            digits = pattern[i + 3 : end] if end > 0 else ""
            if digits and set(digits) <= _HEX and int(digits, 16) <= _MAX_RUNE:
                return int(digits, 16), end + 1
        elif len(digits := pattern[i + 2 : i + 4]) == 2 and set(digits) <= _HEX:
            return int(digits, 16), i + 4
        raise ValueError(f"invalid escape sequence {pattern[i : i + 12]}")
    if kind in _GO_ESCAPES and kind != "b":
        return _GO_ESCAPES[kind], i + 2
    if kind in "pP":
        raise ValueError(f"Unicode classes \\{kind} are not supported")
    if kind.isascii() and not kind.isalnum():
        return ord(kind), i + 2  # escaped punctuation, space or control character: itself
    raise ValueError(f"invalid escape sequence \\{kind}")


def _char_class(pattern: str, i: int) -> tuple[str, int]:
    """Translate the class at ``pattern[i] == '['`` item by item, as Go's parseClass reads it."""
    negate = pattern.startswith("^", i + 1)
    out = ["[^" if negate else "["]
    j = i + 2 if negate else i + 1
    first = True
    while j < len(pattern):
        if pattern[j] == "]" and not first:
            return "".join(out) + "]", j + 1
        first = False
        # Like Go, "[:" starts a named class whenever a ":]" follows, and an unknown name is an error.
        close = pattern.find(":]", j + 2) if pattern.startswith("[:", j) else -1
        if close >= 0:
            name = pattern[j + 2 : close]
            if name.removeprefix("^") not in _POSIX_CLASSES:
                raise ValueError(f"invalid character class {pattern[j : close + 2]}")
            out.append(_class_body(_POSIX_CLASSES[name.removeprefix("^")], negate=name.startswith("^")))
            j = close + 2
            continue
        kind = pattern[j + 1 : j + 2] if pattern[j] == "\\" else ""
        if kind and kind.lower() in _PERL_CLASSES:
            out.append(_class_body(_PERL_CLASSES[kind.lower()], negate=kind.isupper()))
            j += 2
            continue
        low, j = _class_char(pattern, j)
        high = low
        if pattern.startswith("-", j) and pattern[j + 1 : j + 2] not in ("", "]"):
            high, j = _class_char(pattern, j + 1)
            if high < low:
                raise ValueError(f"invalid character class range {chr(low)}-{chr(high)}")
        out.append(_literal(low) if low == high else f"{_literal(low)}-{_literal(high)}")
    raise ValueError("missing closing ]")


def _class_char(pattern: str, j: int) -> tuple[int, int]:
    return _escaped_char(pattern, j) if pattern[j] == "\\" else (ord(pattern[j]), j + 1)


def _class_body(ranges: _Ranges, *, negate: bool = False) -> str:
    """Ranges as the inside of a Python class; ``negate`` takes the complement over all code points."""
    if negate:
        complement, start = [], 0
        for low, high in ranges:
            if low > start:
                complement.append((start, low - 1))
            start = high + 1
        ranges = (*complement, (start, _MAX_RUNE))
    return "".join(
        _literal(low) if low == high else f"{_literal(low)}-{_literal(high)}" for low, high in ranges
    )


def _literal(code: int) -> str:
    """A code point as Python regex text that means exactly itself, inside or outside a class."""
    char = chr(code)
    if char.isascii() and char.isalnum():
        return char
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _show(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
