"""Parameter schemas for actions: strict patterns that every rendered value must pass before it reaches a backend.

Alert labels are attacker-influenced text. Patterns are applied with ``re.fullmatch`` and forbid whitespace and shell
metacharacters wherever a value names something (a node, a job, a namespace); free text (a drain reason) is limited to a
safe printable set. Values then travel as argv elements or API fields, never through a shell.

Each backend gets the pattern of what it accepts as *one* object, and its reserved words are refused: Slurm expands
``ALL`` (any case) to every node in ``scontrol update NodeName=ALL``, and reads ``node[1-4]`` or ``a,b`` as several;
Kubernetes names are lower-case DNS-1123 subdomains (``NODE1``, ``x..y`` and ``4242_7`` are refused by the API).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from app.domain.errors import ParamError

# Any hostname-like node name (a playbook target, before the backend is known): one name, no list, no range.
NODE_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?"
# A Slurm node name: hostname-like, one node (no hostlist brackets or commas); ALL is reserved (SLURM_RESERVED).
SLURM_NODE_NAME = NODE_NAME
# Nodes one exclusion may name (a requeued job kept off a leaf's or a rack's nodes: fleet.max_domain_nodes is at
# most this), and the characters of such a comma-separated list.
MAX_NODE_LIST = 16_384
NODE_LIST_CHARS = 1_048_576
# Several Slurm node names, comma-separated (the nodes a requeued job is kept off), at most MAX_NODE_LIST; the
# command sends them as one compressed hostlist (app/domain/hostlist.py).
SLURM_NODE_LIST = rf"{SLURM_NODE_NAME}(?:,{SLURM_NODE_NAME}){{0,{MAX_NODE_LIST - 1}}}"
SLURM_RESERVED = ("all",)  # compared without case: scontrol reads NodeName=ALL (or all) as every node
# Slurm job ids: 1234, array tasks 1234_7, het components 1234+1.
SLURM_JOB_ID = r"[0-9]{1,12}(?:[_+][0-9]{1,8})?"
# Kubernetes object and node names (DNS-1123 subdomain: dot-separated labels, each alphanumeric at both ends, at
# most 253 characters in all) and namespaces (DNS-1123 label).
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
K8S_NAME = rf"(?=.{{1,253}}$){_DNS_LABEL}(?:\.{_DNS_LABEL})*"
K8S_NODE_NAME = K8S_NAME
K8S_NODE_LIST = (
    rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*(?:,{_DNS_LABEL}(?:\.{_DNS_LABEL})*){{0,{MAX_NODE_LIST - 1}}}"
)
K8S_NAMESPACE = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
# Label/annotation/taint keys: optional DNS prefix, then a name.
K8S_KEY = r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
K8S_LABEL_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"
# Human text carried into a command or API field: printable, no quotes, backslashes, backticks, $ or ; | & < >.
SAFE_TEXT = r"[A-Za-z0-9 _.,:/=@+#%()\[\]-]{0,200}"
URL = r"https?://[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]{1,2000}"
DURATION = r"[0-9]+(?:ms|s|m|h|d)"
ABS_PATH = r"/(?:[A-Za-z0-9._-]+/?)*"


@dataclass(frozen=True)
class Param:
    """One parameter of an action: its type, pattern and whether it must be given."""

    kind: str = "string"  # string | integer | boolean | list
    pattern: str | None = None
    required: bool = True
    default: Any = None
    choices: tuple[str, ...] | None = None
    max_length: int = 256
    description: str = ""
    promql: bool = False  # a PromQL expression: templates render escaped, and only inside "..." literals
    literal: bool = False  # written out in the playbook, never rendered from an alert (where data is sent)
    # Free text for humans (a reason, a message): a reference that renders empty leaves a gap. In every other
    # required parameter an empty reference is an error (planning.render_params).
    prose: bool = False
    escape: Callable[[str], str] | None = None  # applied to each value a template substitutes (chat markup)
    reserved: tuple[str, ...] = ()  # words the backend reads as something else, refused in any case

    def json_schema(self) -> dict[str, Any]:
        """The JSON schema of this parameter before templating (templated strings are always allowed)."""
        if self.kind == "integer":
            return {"anyOf": [{"type": "integer"}, {"type": "string"}], "description": self.description}
        if self.kind == "boolean":
            return {"anyOf": [{"type": "boolean"}, {"type": "string"}], "description": self.description}
        if self.kind == "list":
            return {"type": "array", "items": {"type": "string"}, "description": self.description}
        return {"type": "string", "description": self.description}


def validate_params(action: str, schema: Mapping[str, Param], raw: Mapping[str, Any]) -> dict[str, Any]:
    """Check rendered values against ``schema``; return them typed, with defaults. Raises :class:`ParamError`."""
    unknown = sorted(set(raw) - set(schema))
    if unknown:
        raise ParamError(
            action, unknown[0], f"unknown parameter (allowed: {', '.join(sorted(schema)) or 'none'})"
        )
    out: dict[str, Any] = {}
    for name, spec in schema.items():
        if name not in raw or raw[name] is None or raw[name] == "":
            if spec.required and spec.default is None:
                raise ParamError(action, name, "is required")
            if spec.default is not None:
                out[name] = spec.default
            continue
        out[name] = _coerce(action, name, spec, raw[name])
    return out


def _coerce(action: str, name: str, spec: Param, value: Any) -> Any:
    if spec.kind == "integer":
        if isinstance(value, bool) or not re.fullmatch(r"-?[0-9]{1,12}", str(value)):
            raise ParamError(action, name, f"expected an integer, got {_show(value)}")
        return int(value)
    if spec.kind == "boolean":
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "false"):
            return str(value).lower() == "true"
        raise ParamError(action, name, f"expected true or false, got {_show(value)}")
    if spec.kind == "list":
        if not isinstance(value, list):
            raise ParamError(action, name, f"expected a list, got {_show(value)}")
        return [_check_string(action, f"{name}[{i}]", spec, item) for i, item in enumerate(value)]
    return _check_string(action, name, spec, value)


def _check_string(action: str, name: str, spec: Param, value: Any) -> str:
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise ParamError(action, name, f"expected a string, got {_show(value)}")
    text = str(value)
    if len(text) > spec.max_length:
        raise ParamError(action, name, f"longer than {spec.max_length} characters")
    if spec.choices is not None and text not in spec.choices:
        raise ParamError(action, name, f"{_show(text)} is not one of {', '.join(spec.choices)}")
    if spec.pattern is not None and not re.fullmatch(spec.pattern, text):
        raise ParamError(action, name, f"{_show(text)} does not match the pattern {spec.pattern}")
    if text.lower() in spec.reserved:
        raise ParamError(
            action, name, f"{_show(text)} is a reserved word of the backend (it names more than one)"
        )
    return text


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
