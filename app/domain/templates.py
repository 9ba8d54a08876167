"""Value-only templates: ``{{ namespace.key }}`` substitutes one value, and nothing else.

There are no expressions, filters, conditionals or loops, so a playbook cannot compute anything from alert
text: it can only place a value where an action parameter (checked against a strict pattern) or a PromQL
string literal expects one.

Namespaces: ``labels`` and ``annotations`` (of the alert), ``target`` (the playbook's rendered target),
``diagnosis`` and ``incident``. Whitespace inside the braces is optional. A missing key renders as the empty
string, as a missing label does in Alertmanager matchers; where a value is required (``required=True``: an action's
required parameter), an empty value is an error instead, so ``/shared/checkpoints/{{ labels.train_job }}`` cannot
quietly become the root ``/shared/checkpoints/``. ``escape`` transforms each substituted value for the markup it
lands in (chat mrkdwn), never the template's own text.

PromQL templates (a playbook's ``recheck`` and ``verify``) must place every reference inside a double-quoted
string literal, e.g. ``up{instance="{{ labels.instance }}"}``; :func:`render_promql` escapes each substituted
value for that literal, so a label value such as ``"} or vector(1) or {x="`` stays a string and cannot change
the query. The literal must not be a regular expression (the right side of ``=~`` or ``!~``): a label ``.*``
would widen the query, and nothing escapes regex syntax, so such a template is refused. A ``{{`` cannot be
written literally in a template.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NAMESPACES: tuple[str, ...] = ("labels", "annotations", "target", "diagnosis", "incident")
KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What a PromQL double-quoted string needs escaped (Go string syntax): the rest of the text is taken verbatim.
_PROMQL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r"}
_PROMQL_SPECIAL = re.compile(r'[\\"\n\r]')


class TemplateError(ValueError):
    """A template is malformed; ``column`` is the 1-based position of the offending ``{{`` in the text."""

    def __init__(self, message: str, column: int):
        super().__init__(f"column {column}: {message}")
        self.column = column


@dataclass(frozen=True)
class Ref:
    """One ``{{ namespace.key }}`` reference and where it starts (0-based offset)."""

    namespace: str
    key: str
    offset: int


def _parse(text: str, namespaces: Collection[str] = NAMESPACES) -> tuple[str | Ref, ...]:
    """Split ``text`` into literal chunks and references. Raises :class:`TemplateError`."""
    return _split(text, tuple(namespaces))


@functools.lru_cache(maxsize=4096)  # a playbook's few templates, rendered for every alert it matches
def _split(text: str, namespaces: tuple[str, ...]) -> tuple[str | Ref, ...]:
    parts: list[str | Ref] = []
    pos = 0
    while (start := text.find("{{", pos)) != -1:
        end = text.find("}}", start + 2)
        column = start + 1
        if end == -1:
            raise TemplateError("unclosed '{{'", column)
        inner = text[start + 2 : end].strip()
        namespace, dot, key = inner.partition(".")
        if not dot:
            raise TemplateError(f"expected {{{{ namespace.key }}}}, got {{{{ {inner} }}}}", column)
        if namespace not in namespaces:
            raise TemplateError(
                f"unknown namespace {namespace!r} (allowed here: {', '.join(namespaces)})", column
            )
        if not KEY.fullmatch(key):
            raise TemplateError(
                f"bad key {key!r} in {{{{ {inner} }}}} (a key is a name like Hostname or slurm_job_id; "
                "templates substitute values only, no expressions or filters)",
                column,
            )
        if start > pos:
            parts.append(text[pos:start])
        parts.append(Ref(namespace, key, start))
        pos = end + 2
    if pos < len(text):
        parts.append(text[pos:])
    return tuple(parts)


def template_refs(text: str) -> list[tuple[str, str]]:
    """The ``(namespace, key)`` pairs ``text`` references, in order. Raises :class:`TemplateError`."""
    return [(part.namespace, part.key) for part in _parse(text) if isinstance(part, Ref)]


def check_template(text: str, namespaces: Collection[str] = NAMESPACES) -> None:
    """Raise :class:`TemplateError` unless ``text`` is a valid template using only ``namespaces``."""
    _parse(text, namespaces)


def check_promql_template(text: str, namespaces: Collection[str] = NAMESPACES) -> None:
    """Like :func:`check_template`; also every reference must sit inside a PromQL double-quoted literal."""
    _check_quoted(_parse(text, namespaces))


def render(
    text: str,
    context: Mapping[str, Mapping[str, Any]],
    *,
    required: bool = False,
    escape: Callable[[str], str] | None = None,
) -> str:
    """Substitute each reference with its value in ``context`` (missing: "", or TemplateError when ``required``),
    passed through ``escape`` if given. Raises TemplateError."""
    out = []
    # The context may add a namespace its caller's load-time check allowed ({{ node.name }} in node_repair).
    for part in _parse(text, (*NAMESPACES, *context)):
        if isinstance(part, str):
            out.append(part)
            continue
        value = _lookup(context, part)
        if required and not value:
            raise TemplateError(f"{{{{ {part.namespace}.{part.key} }}}} is empty or missing", part.offset + 1)
        out.append(escape(value) if escape else value)
    return "".join(out)


def render_promql(text: str, context: Mapping[str, Mapping[str, Any]]) -> str:
    """Render a PromQL template, escaping each value for the double-quoted literal that must surround it.

    Raises :class:`TemplateError` for a malformed template or a reference outside a double-quoted literal, so
    an unchecked template can never splice raw alert text into a query.
    """
    parts = _parse(text)
    _check_quoted(parts)
    return "".join(
        part if isinstance(part, str) else _PROMQL_SPECIAL.sub(_escape, _lookup(context, part))
        for part in parts
    )


def render_value(
    value: Any,
    context: Mapping[str, Mapping[str, Any]],
    *,
    required: bool = False,
    escape: Callable[[str], str] | None = None,
) -> Any:
    """Render every string in ``value``, recursing into lists and dict values; other values stay as is."""
    if isinstance(value, str):
        return render(value, context, required=required, escape=escape)
    if isinstance(value, list):
        return [render_value(item, context, required=required, escape=escape) for item in value]
    if isinstance(value, dict):
        return {
            key: render_value(item, context, required=required, escape=escape) for key, item in value.items()
        }
    return value


def is_templated(value: Any) -> bool:
    """Whether ``value`` (a string, or lists/dicts of them) contains a ``{{`` anywhere."""
    if isinstance(value, str):
        return "{{" in value
    if isinstance(value, list):
        return any(is_templated(item) for item in value)
    if isinstance(value, dict):
        return any(is_templated(item) for item in value.values())
    return False


def _lookup(context: Mapping[str, Mapping[str, Any]], ref: Ref) -> str:
    value = context.get(ref.namespace, {}).get(ref.key)
    return "" if value is None else str(value)


def _escape(match: re.Match[str]) -> str:
    return _PROMQL_ESCAPES[match.group(0)]


def _check_quoted(parts: Sequence[str | Ref]) -> None:
    """Follow PromQL's lexer through the literal chunks; every reference must fall inside a "..." string.

    A reference right after a backslash is refused too: the backslash would swallow the first character of the
    escaped value (``\\`` + ``\\"`` reads as an escaped backslash followed by a closing quote).
    """
    state = "code"  # code | "'" | '"' | "`" | comment
    escaped = False
    code_tail = (
        ""  # the last two non-blank characters of code: "=~" or "!~" before a literal makes it a regex
    )
    regex = False  # the literal being read is the right side of =~ or !~
    for part in parts:
        if isinstance(part, Ref):
            if state != '"' or escaped:
                where = "right after a backslash" if escaped else "outside a double-quoted string"
                raise TemplateError(
                    f"{{{{ {part.namespace}.{part.key} }}}} is {where}; in PromQL a reference must sit "
                    'inside a "..." literal, e.g. {instance="{{ labels.instance }}"}',
                    part.offset + 1,
                )
            if regex:
                raise TemplateError(
                    f"{{{{ {part.namespace}.{part.key} }}}} is inside a regular expression (after =~ or !~), "
                    "where a value such as .* would match more than the alert's series; use = or != instead",
                    part.offset + 1,
                )
            continue
        for char in part:
            if state == "code":
                if char in "\"'`":
                    state = char
                    regex = code_tail in ("=~", "!~")
                elif char == "#":
                    state = "comment"
                elif not char.isspace():
                    code_tail = (code_tail + char)[-2:]
            elif state == "comment":
                if char == "\n":
                    state = "code"
            elif escaped:
                escaped = False
            elif char == "\\" and state != "`":
                escaped = True
            elif char == state:
                state = "code"
                code_tail = ""
