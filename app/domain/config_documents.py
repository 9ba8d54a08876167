"""YAML configuration documents with the line of every key and item, and a per-document error collector.

:func:`read_documents` turns YAML text into plain data (keys as written, duplicate keys refused, aliases bounded)
and remembers where each value came from; :class:`DocumentCheck` collects ``file:line: message`` problems for one
document, starting with its JSON-schema errors. Used by :mod:`app.domain.playbooks` and :mod:`app.domain.permissions`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
import yaml

from app.domain.errors import ConfigError

PathKey = tuple[str | int, ...]
# Values in one document once aliases are expanded (what jsonschema walks): stops "billion laughs" YAML.
MAX_EXPANDED_VALUES = 100_000
DURATION_HINT = "expected e.g. 30s, 10m, 24h, 7d or 1h30m"


# --- YAML documents with line numbers ----------------------------------------------------------------------


class ConfigFileError(ConfigError):
    """A configuration file is invalid. ``errors`` lists every problem as ``file:line: message``."""

    def __init__(self, errors: Sequence[str]):
        super().__init__("\n".join(errors))
        self.errors = list(errors)


@dataclass(frozen=True)
class Document:
    """One YAML document as plain data, with the 1-based line of every mapping key and list item (by path)."""

    data: Any
    line: int
    lines: Mapping[PathKey, int]

    def line_of(self, path: PathKey) -> int:
        """The line of ``path``, or of its nearest recorded ancestor."""
        for end in range(len(path), 0, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return self.line


def read_documents(text: str, source: str) -> tuple[list[Document], list[str]]:
    """Every non-empty YAML document in ``text``, and ``source:line: message`` errors.

    Keys are taken as written (``on:`` is the string "on", not YAML 1.1's True); duplicate keys are errors.
    A syntax error ends the stream (the documents before it are returned); any other error skips its document.
    """
    documents: list[Document] = []
    errors: list[str] = []
    loader = yaml.SafeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            assert node is not None  # check_node() said one follows
            reader = _NodeReader(loader)
            try:
                data = reader.convert(node, ())
            except yaml.MarkedYAMLError as exc:
                errors.append(_yaml_error(exc, source))
                continue
            if reader.sizes[id(node)] > MAX_EXPANDED_VALUES:
                reader.errors.append(
                    (
                        node.start_mark.line + 1,
                        f"more than {MAX_EXPANDED_VALUES} values once aliases are expanded",
                    )
                )
            if reader.errors:
                errors.extend(f"{source}:{line}: {message}" for line, message in reader.errors)
            elif data is not None:
                documents.append(Document(data, node.start_mark.line + 1, reader.lines))
    except yaml.YAMLError as exc:
        errors.append(_yaml_error(exc, source))
    finally:
        loader.dispose()
    return documents, errors


def _yaml_error(exc: yaml.YAMLError, source: str) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = mark.line + 1 if mark is not None else 1
    problem = getattr(exc, "problem", None) or str(exc)
    kind = "unsupported YAML" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax error"
    return f"{source}:{line}: {kind}: {problem}"


class _NodeReader:
    """Composed YAML nodes → dicts, lists and scalars, with lines; an alias is converted once, then shared."""

    def __init__(self, loader: yaml.SafeLoader):
        self.loader = loader
        self.lines: dict[PathKey, int] = {}
        self.errors: list[tuple[int, str]] = []
        self._done: dict[int, Any] = {}
        self._active: set[int] = set()
        # Node id → values under it with aliases expanded, so sharing cannot hide an exponential document.
        self.sizes: dict[int, int] = {}

    def convert(self, node: yaml.Node, path: PathKey) -> Any:
        if id(node) in self._done:
            return self._done[id(node)]
        if id(node) in self._active:
            self.errors.append((node.start_mark.line + 1, f"{_dotted(path)}: an alias refers to itself"))
            self.sizes[id(node)] = 1
            return None
        self._active.add(id(node))
        if isinstance(node, yaml.MappingNode):
            self.loader.flatten_mapping(node)  # expands `<<: *anchor` merge keys
            value: Any = self._mapping(node, path)
            children = [child for _, child in node.value]
        elif isinstance(node, yaml.SequenceNode):
            value = []
            for index, item in enumerate(node.value):
                self.lines[(*path, index)] = item.start_mark.line + 1
                value.append(self.convert(item, (*path, index)))
            children = node.value
        else:
            value = self.loader.construct_object(node, deep=True)
            children = []
        self.sizes[id(node)] = 1 + sum(self.sizes.get(id(child), 1) for child in children)
        self._active.discard(id(node))
        self._done[id(node)] = value
        return value

    def _mapping(self, node: yaml.MappingNode, path: PathKey) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                self.errors.append((line, f"{_dotted(path) or 'document'}: a key must be a plain string"))
                continue
            key = key_node.value
            if key in out:
                self.errors.append((line, f"{_dotted((*path, key))}: duplicate key {key!r}"))
                continue
            self.lines[(*path, key)] = line
            out[key] = self.convert(value_node, (*path, key))
        return out


def _dotted(path: PathKey) -> str:
    """``("steps", 0, "with", "node")`` → ``steps[0].with.node``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


# --- checking one document ---------------------------------------------------------------------------------


_TYPE_WORDS = {"object": "mapping", "array": "list"}


class DocumentCheck:
    """Collects ``file:line: message`` problems for one document, starting with its JSON-schema errors.

    ``schema`` must fix ``properties.kind.const``: a document of another kind gets that one error.

    Semantic checks ask :meth:`typed` / :meth:`sound` before looking at a section, so a section the schema
    already rejected (wrong type, missing or unknown key) is reported once, by the schema, and never crashes a
    later check.
    """

    def __init__(self, doc: Document, source: str, schema: Mapping[str, Any]):
        self.doc = doc
        self.source = source
        self._problems: list[tuple[int, str]] = []
        self._broken: list[PathKey] = []
        kind = schema["properties"]["kind"]["const"]
        found = doc.data.get("kind", kind) if isinstance(doc.data, dict) else kind
        if found != kind:
            # Another kind of document: one clear error, not one per key the two kinds do not share.
            self.fail(("kind",), f"expected {kind!r}, got {show(found)}")
            self._broken.append(())
            return
        for error in jsonschema.Draft202012Validator(schema).iter_errors(doc.data):
            self._schema_error(error)

    def fail(self, path: PathKey, message: str, *, at: PathKey | None = None) -> None:
        """Record ``message`` about ``path`` (its line is that of ``at``, default ``path``)."""
        where = _dotted(path)
        line = self.doc.line_of(path if at is None else at)
        self._problems.append((line, f"{where}: {message}" if where else message))

    def typed(self, path: PathKey) -> bool:
        """Whether the value at ``path``, and every mapping or list holding it, has the type the schema wants.

        Its contents may still be wrong: check each item with :meth:`sound`.
        """
        return not any(path[: len(broken)] == broken for broken in self._broken)

    def sound(self, path: PathKey) -> bool:
        """Whether the schema found nothing wrong with ``path``, inside it, or with what holds it."""
        return self.typed(path) and not any(broken[: len(path)] == path for broken in self._broken)

    @property
    def ok(self) -> bool:
        """No problem recorded so far."""
        return not self._problems

    def messages(self) -> list[str]:
        """Every problem as ``source:line: message``, by line, without repeats."""
        ordered = sorted(enumerate(self._problems), key=lambda item: (item[1][0], item[0]))
        seen = dict.fromkeys(f"{self.source}:{line}: {message}" for _, (line, message) in ordered)
        return list(seen)

    def _schema_error(self, error: jsonschema.ValidationError) -> None:
        path: PathKey = tuple(error.absolute_path)
        schema = error.schema if isinstance(error.schema, dict) else {}
        title = schema.get("title")
        value: Any = error.instance
        kind = error.validator
        expected_value: Any = (
            error.validator_value
        )  # jsonschema types it as possibly unset; a failed check sets it
        if kind == "additionalProperties":
            known = schema.get("properties", {})
            for key in sorted(set(value) - set(known)):
                inside = f" in {title}" if title else ""
                allowed = ", ".join(sorted(known)) or "none"
                self.fail(path, f"unknown key {key!r}{inside} (allowed: {allowed})", at=(*path, key))
                self._broken.append((*path, key))
            return
        if kind == "required":
            for key in expected_value:
                if key not in value:
                    self.fail(path, f"missing required key {key!r}" + (f" in {title}" if title else ""))
                    self._broken.append((*path, key))
            return
        self._broken.append(path)
        if kind == "type":
            expected = expected_value if isinstance(expected_value, list) else [expected_value]
            words = " or ".join(_TYPE_WORDS.get(str(word), str(word)) for word in expected)
            self.fail(path, f"expected {words}, got {_describe(value)}")
        elif kind == "enum":
            options = ", ".join(str(option) for option in expected_value)
            if title:
                self.fail(path, f"unknown {title} {show(value)} (known: {options or 'none'})")
            else:
                self.fail(path, f"{show(value)} is not one of: {options}")
        elif kind == "const":
            self.fail(path, f"expected {expected_value!r}, got {show(value)}")
        elif kind == "pattern" and title == "duration":
            self.fail(path, f"bad duration {show(value)} ({DURATION_HINT})")
        elif kind == "pattern":
            self.fail(path, f"bad {title or 'value'} {show(value)} (must match {expected_value})")
        elif kind == "minItems" and expected_value == 1:
            self.fail(path, "must not be empty")
        elif kind == "minimum":
            self.fail(path, f"must be at least {expected_value}, got {show(value)}")
        else:
            self.fail(path, error.message)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "mapping"}
    kind = kinds.get(type(value), type(value).__name__)
    return kind if isinstance(value, list | dict) else f"{kind} {show(value)}"


def show(value: Any) -> str:
    """repr(value), shortened for messages."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
