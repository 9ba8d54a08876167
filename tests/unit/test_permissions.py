"""The permissions whitelist: loading with file:line errors, scoping, read-only actions and explanations."""

from __future__ import annotations

import re
import textwrap

import pytest

from app.actions.base import Action, Plan
from app.actions.registry import ActionRegistry
from app.domain.errors import ConfigError
from app.domain.outcome import Ok
from app.domain.params import NODE_NAME, Param
from app.domain.permissions import Grant, Permissions, PermissionsError, load_permissions


class _TestAction(Action):
    params = {"node": Param(pattern=NODE_NAME)}

    def plan(self, params):
        return Plan(summary=self.name, command=self.name)

    def run(self, params, ctx):
        return Ok(command=self.name)


class DrainNode(_TestAction):
    name = "slurm.drain_node"


class ResumeNode(_TestAction):
    name = "slurm.resume_node"
    return_to_service = True


class JobLog(_TestAction):
    name = "slurm.job_log"
    read_only = True


class CordonNode(_TestAction):
    name = "kubernetes.cordon_node"


DRAIN, RESUME, LOG, CORDON = DrainNode(), ResumeNode(), JobLog(), CordonNode()
REGISTRY = ActionRegistry([DRAIN, RESUME, LOG, CORDON])
KNOWN = "kubernetes.cordon_node, slurm.drain_node, slurm.job_log, slurm.resume_node"
HEAD = "apiVersion: nightshift/v1\nkind: Permissions\n"


def load(tmp_path, text: str) -> Permissions:
    path = tmp_path / "permissions.yaml"
    path.write_text(text)
    return load_permissions(path, REGISTRY)


def errors_of(tmp_path, text: str) -> list[str]:
    with pytest.raises(PermissionsError) as caught:
        load(tmp_path, text)
    assert isinstance(caught.value, ConfigError)
    prefix = str(tmp_path / "permissions.yaml")
    return [error.replace(prefix, "p.yaml") for error in caught.value.errors]


def test_no_file_means_advisory():
    permissions = load_permissions(None, REGISTRY)
    assert permissions.advisory
    assert permissions.allows(DRAIN, {"node": "gpu-1"}) is None
    assert permissions.explain(DRAIN, {"node": "gpu-1"}) == "no grant for slurm.drain_node"


def test_read_only_actions_need_no_grant():
    permissions = Permissions()
    grant = permissions.allows(LOG, {})
    assert grant == Grant(action="slurm.job_log", source="read-only action")
    assert permissions.explain(LOG, {}) == "allowed: slurm.job_log is read-only"


def test_grants_load_with_their_scopes_and_lines(tmp_path):
    permissions = load(
        tmp_path,
        HEAD
        + textwrap.dedent(
            """\
            allow:
              - action: slurm.drain_node
                nodes: "gpu-[0-9]+"
                partitions: [batch, long]
              - action: "kubernetes.*"
                namespaces: [training]
                clusters: [prod-a]
            """
        ),
    )
    drain, kube = permissions.grants
    assert not permissions.advisory
    assert (drain.action, drain.nodes.pattern, drain.partitions, drain.line) == (
        "slurm.drain_node",
        "gpu-[0-9]+",
        ("batch", "long"),
        4,
    )
    assert (drain.namespaces, drain.clusters) == (None, None)
    assert (kube.action, kube.nodes, kube.namespaces, kube.clusters, kube.line) == (
        "kubernetes.*",
        None,
        ("training",),
        ("prod-a",),
        7,
    )
    assert drain.source == str(tmp_path / "permissions.yaml")


def test_scopes_restrict_the_target():
    grant = Grant(action="slurm.drain_node", nodes=re.compile("gpu-[0-9]+"), partitions=("batch",))
    permissions = Permissions([grant])
    assert permissions.allows(DRAIN, {"node": "gpu-12", "partition": "batch"}) is grant
    assert permissions.explain(DRAIN, {"node": "gpu-12", "partition": "batch"}) == (
        "allowed by the grant for slurm.drain_node at :0"
    )
    # fullmatch: a prefix is not enough
    assert permissions.allows(DRAIN, {"node": "gpu-12x", "partition": "batch"}) is None
    assert permissions.explain(DRAIN, {"node": "gpu-12x", "partition": "batch"}) == (
        "grant for slurm.drain_node does not cover node 'gpu-12x' (nodes: gpu-[0-9]+)"
    )
    assert permissions.explain(DRAIN, {"node": "gpu-1", "partition": "debug"}) == (
        "grant for slurm.drain_node does not cover partition 'debug' (partitions: batch)"
    )
    # A target without the scoped field is not covered: fail closed.
    assert permissions.allows(DRAIN, {"node": "gpu-1"}) is None
    assert permissions.explain(DRAIN, {"node": "gpu-1"}) == (
        "grant for slurm.drain_node is limited to partitions batch but the target names no partition"
    )
    assert (
        permissions.explain(RESUME, {"node": "gpu-1", "partition": "batch"})
        == "no grant for slurm.resume_node"
    )


def test_globs_and_the_first_covering_grant(tmp_path):
    permissions = load(
        tmp_path,
        HEAD
        + textwrap.dedent(
            """\
            allow:
              - action: "slurm.*"
                nodes: "gpu-a[0-9]+"
              - action: "slurm.*_node"
                clusters: [prod-b]
            """
        ),
    )
    first, second = permissions.grants
    assert permissions.allows(DRAIN, {"node": "gpu-a1"}) is first
    assert permissions.allows(RESUME, {"node": "gpu-b1", "cluster": "prod-b"}) is second
    assert permissions.allows(CORDON, {"node": "gpu-a1"}) is None
    assert permissions.explain(RESUME, {"node": "gpu-b1"}) == (
        "grant for slurm.* does not cover node 'gpu-b1' (nodes: gpu-a[0-9]+); "
        "grant for slurm.*_node is limited to clusters prod-b but the target names no cluster"
    )
    path = tmp_path / "permissions.yaml"
    assert permissions.explain(RESUME, {"node": "gpu-b1", "cluster": "prod-b"}) == (
        f"allowed by the grant for slurm.*_node at {path}:6"
    )


def test_empty_allow_list_is_advisory(tmp_path):
    assert load(tmp_path, HEAD + "allow: []\n").advisory


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            "allow:\n  - action: slurm.drian_node\n",
            [f"p.yaml:4: allow[0].action: unknown action 'slurm.drian_node' (known: {KNOWN})"],
            id="unknown-action",
        ),
        pytest.param(
            "allow:\n  - action: slurm.drain_node\n  - action: 'slrum.*'\n",
            [f"p.yaml:5: allow[1].action: 'slrum.*' matches no known action (known: {KNOWN})"],
            id="glob-matching-nothing",
        ),
        pytest.param(
            "allow:\n  - action: slurm.drain_node\n    nodes: 'gpu-[0-9'\n",
            ["p.yaml:5: allow[0].nodes: bad regex 'gpu-[0-9': unterminated character set at position 4"],
            id="bad-regex",
        ),
        pytest.param(
            "allow:\n  - action: slurm.drain_node\n    node: gpu-1\n",
            [
                "p.yaml:5: allow[0]: unknown key 'node' in grant "
                "(allowed: action, clusters, namespaces, nodes, partitions)"
            ],
            id="unknown-key",
        ),
        pytest.param(
            "allow:\n  - action: slurm.drain_node\n    partitions: batch\n",
            ["p.yaml:5: allow[0].partitions: expected list, got string 'batch'"],
            id="scope-not-a-list",
        ),
        pytest.param(
            "allow:\n  - action: slurm.drain_node\n    namespaces: []\n",
            ["p.yaml:5: allow[0].namespaces: must not be empty"],
            id="empty-scope",
        ),
        pytest.param(
            "allow:\n  - nodes: 'gpu-.*'\n",
            ["p.yaml:4: allow[0]: missing required key 'action' in grant"],
            id="missing-action",
        ),
        pytest.param(
            "allow:\n  - action: slurm.drain_node\n    nodes: 'x'\n    nodes: 'y'\n",
            ["p.yaml:6: allow[0].nodes: duplicate key 'nodes'"],
            id="duplicate-key",
        ),
        pytest.param(
            "grants: []\n",
            [
                "p.yaml:1: missing required key 'allow' in permissions",
                "p.yaml:3: unknown key 'grants' in permissions (allowed: allow, apiVersion, kind)",
            ],
            id="wrong-top-level-key",
        ),
        pytest.param(
            "allow:\n  - action: slurm.drain_node\n    nodes: [gpu-1\n",
            ["p.yaml:6: YAML syntax error: expected ',' or ']', but got '<stream end>'"],
            id="yaml-syntax",
        ),
        pytest.param(
            "allow:\n  - action: slurm.drian_node\n  - action: slurm.drain_node\n    nodes: '('\n",
            [
                f"p.yaml:4: allow[0].action: unknown action 'slurm.drian_node' (known: {KNOWN})",
                "p.yaml:6: allow[1].nodes: bad regex '(': missing ), unterminated subpattern at position 0",
            ],
            id="every-error-at-once",
        ),
        pytest.param(
            "allow:\n  - action: slurm.drain_node\n    nodes: 5\n  - action: slurm.nope\n",
            [
                "p.yaml:5: allow[0].nodes: expected string, got integer 5",
                f"p.yaml:6: allow[1].action: unknown action 'slurm.nope' (known: {KNOWN})",
            ],
            id="schema-and-semantic-errors-in-different-grants",
        ),
    ],
)
def test_error_names_file_and_line(tmp_path, body, expected):
    assert errors_of(tmp_path, HEAD + body) == expected


def test_wrong_kind(tmp_path):
    text = "apiVersion: nightshift/v1\nkind: Playbook\nmetadata: {name: p}\nmatch: ['a=\"b\"']\n"
    assert errors_of(tmp_path, text) == ["p.yaml:2: kind: expected 'Permissions', got 'Playbook'"]


def test_empty_file_is_an_error(tmp_path):
    assert errors_of(tmp_path, "# nothing yet\n") == [
        "p.yaml:1: no Permissions document (to grant nothing, write `allow: []`)"
    ]


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(PermissionsError, match="cannot read"):
        load_permissions(tmp_path / "absent.yaml", REGISTRY)
