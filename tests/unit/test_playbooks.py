"""Playbooks: the model, every loader error with its file:line, the JSON schema, and indexed matching."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace
from datetime import timedelta

import jsonschema
import pytest

from app.actions import default_registry
from app.actions.base import Action, Plan
from app.actions.registry import ActionRegistry
from app.domain import playbooks as playbooks_module
from app.domain.config_documents import read_documents
from app.domain.errors import ConfigError, ParamError
from app.domain.matchers import parse_matchers
from app.domain.outcome import Ok
from app.domain.params import NODE_NAME, SAFE_TEXT, SLURM_JOB_ID, Param
from app.domain.playbooks import (
    SCHEMA_PATH,
    Budget,
    Playbook,
    PlaybookError,
    PlaybookSet,
    Step,
    Verify,
    load_playbooks,
    parse_duration,
    parse_playbooks,
    playbook_schema,
    write_schema,
)


class _TestAction(Action):
    def plan(self, params):
        return Plan(summary=self.name, command=self.name)

    def run(self, params, ctx):
        return Ok(command=self.name)


class Drain(_TestAction):
    name = "test.drain"
    params = {
        "node": Param(pattern=NODE_NAME),
        "reason": Param(pattern=SAFE_TEXT, required=False, default="nightshift"),
    }


class Requeue(_TestAction):
    name = "test.requeue"
    params = {
        "job": Param(pattern=SLURM_JOB_ID),
        "hold": Param(kind="boolean", required=False, default=False),
    }


class Notify(_TestAction):
    name = "test.notify"
    read_only = True
    params = {
        "channel": Param(required=False, choices=("ops", "ml")),
        "tags": Param(kind="list", required=False, pattern=r"[a-z0-9:]+"),
    }


class JobLog(_TestAction):
    name = "test.job_log"
    read_only = True
    params = {"job": Param(pattern=SLURM_JOB_ID), "lines": Param(kind="integer", required=False, default=200)}


REGISTRY = ActionRegistry([Drain(), Requeue(), Notify(), JobLog()])
HEAD = "apiVersion: nightshift/v1\nkind: Playbook\nmetadata: {name: p}\n"  # lines 1-3 of every error case
ROOT_KEYS = (
    "apiVersion, budget, collect, cooldown, exclude_node, kind, match, metadata, node_repair, on_resolved, "
    "priority, recheck, self_recovery, serialize, steps, "
)
FULL = """\
apiVersion: nightshift/v1
kind: Playbook
metadata: {name: gpu-fell-off-bus, description: "Xid 79: GPU unreachable"}
match: ['alertname="GpuXidError"', 'xid=~"79|48"']
target: {scheduler: slurm, node: "{{ labels.Hostname }}", job: "{{ labels.slurm_job_id }}"}
serialize: job
budget: {attempts: 2, window: 12h, backoff: 1h30m}
cooldown: 45m
recheck: 'DCGM_EXP_XID_ERRORS_COUNT{Hostname="{{ labels.Hostname }}",xid="79"} > 0'
collect:
  - action: test.job_log
    with: {job: "{{ target.job }}", lines: 50}
steps:
  - action: test.drain
    with: {node: "{{ target.node }}", reason: "Xid {{ labels.xid }}"}
  - action: test.requeue
    name: requeue the job
    with: {job: "{{ target.job }}"}
    approval: required
  - action: test.notify
    when: ['diagnosis=~"gpu_.*"']
    with: {tags: [nightshift, "xid:{{ labels.xid }}"]}
verify: {promql: 'increase(steps_total{slurm_job_id="{{ target.job }}"}[2m]) > 0', timeout: 20m, interval: 1m}
on_resolved:
  - action: test.notify
    with: {channel: ops}
"""


def errors_of(text: str, source: str = "pb.yaml") -> list[str]:
    with pytest.raises(PlaybookError) as caught:
        parse_playbooks(text, source, REGISTRY)
    assert str(caught.value) == "\n".join(caught.value.errors)
    return caught.value.errors


def case(body: str) -> str:
    return HEAD + textwrap.dedent(body)


# --- the model ---------------------------------------------------------------------------------------------


def test_full_playbook_loads_into_the_model():
    [playbook] = parse_playbooks(FULL, "gpu.yaml", REGISTRY)
    assert playbook.name == "gpu-fell-off-bus"
    assert playbook.description == "Xid 79: GPU unreachable"
    assert playbook.match == tuple(parse_matchers('alertname="GpuXidError", xid=~"79|48"'))
    assert playbook.target == {
        "scheduler": "slurm",
        "node": "{{ labels.Hostname }}",
        "job": "{{ labels.slurm_job_id }}",
    }
    assert playbook.serialize == "job"
    assert playbook.budget == Budget(
        attempts=2, window=timedelta(hours=12), backoff=timedelta(hours=1, minutes=30)
    )
    assert playbook.cooldown == timedelta(minutes=45)
    assert playbook.recheck == 'DCGM_EXP_XID_ERRORS_COUNT{Hostname="{{ labels.Hostname }}",xid="79"} > 0'
    assert playbook.collect == (
        Step(
            action="test.job_log",
            with_={"job": "{{ target.job }}", "lines": 50},
            name="test.job_log",
            line=11,
        ),
    )
    drain, requeue, notify = playbook.steps
    assert drain == Step(
        action="test.drain",
        with_={"node": "{{ target.node }}", "reason": "Xid {{ labels.xid }}"},
        name="test.drain",
        line=14,
    )
    assert (requeue.name, requeue.approval, requeue.line) == ("requeue the job", True, 16)
    assert notify.when == tuple(parse_matchers('diagnosis=~"gpu_.*"'))
    assert notify.approval is False
    assert playbook.verify == Verify(
        promql='increase(steps_total{slurm_job_id="{{ target.job }}"}[2m]) > 0',
        timeout=timedelta(minutes=20),
        interval=timedelta(minutes=1),
    )
    assert playbook.on_resolved == (
        Step(action="test.notify", with_={"channel": "ops"}, name="test.notify", line=25),
    )
    assert (playbook.source, playbook.line) == ("gpu.yaml", 1)


def test_defaults_and_several_documents():
    text = case(
        """\
        match: ['alertname="A"']
        target: {node: "{{ labels.host }}"}
        collect: [{action: test.job_log, with: {job: "1234"}}]
        ---
        # a comment first
        apiVersion: nightshift/v1
        kind: Playbook
        metadata: {name: q}
        match: ['alertname="B"']
        target: {job: "{{ labels.job }}", namespace: training}
        steps: [{action: test.notify}]
        ---
        """
    )
    first, second = parse_playbooks(text, "two.yaml", REGISTRY)
    assert (first.name, first.line, second.name, second.line) == ("p", 1, "q", 9)
    assert first.budget == Budget() == Budget(3, timedelta(hours=24), timedelta(minutes=10))
    assert first.cooldown == timedelta(minutes=30)
    assert (first.recheck, first.verify, first.steps, first.on_resolved) == (None, None, (), ())
    # serialize defaults to the most specific key the target names
    assert (first.serialize, second.serialize) == ("node", "job")
    assert Verify(promql="up").timeout == timedelta(minutes=20)
    assert Verify(promql="up").interval == timedelta(seconds=15)


def test_render_target_renders_drops_missing_and_checks_every_value():
    [playbook] = parse_playbooks(FULL, "gpu.yaml", REGISTRY)
    target = playbook.render_target({"Hostname": "gpu-07", "slurm_job_id": "1234"}, {})
    assert target == {"scheduler": "slurm", "node": "gpu-07", "job": "1234"}
    assert playbook.render_target({"Hostname": "gpu-07"}, {}) == {"scheduler": "slurm", "node": "gpu-07"}
    with pytest.raises(ParamError, match="target: parameter 'node'"):
        playbook.render_target({"Hostname": "gpu-07; reboot"}, {})


def test_target_values_may_be_templates_checked_once_rendered():
    [playbook] = parse_playbooks(
        case('match: [\'a="b"\']\ntarget: {kind: "{{ labels.kind }}"}\nsteps: [{action: test.notify}]\n'),
        "k.yaml",
        REGISTRY,
    )
    assert playbook.render_target({"kind": "PyTorchJob"}, {}) == {"kind": "PyTorchJob"}
    with pytest.raises(ParamError, match="'CronJob' is not one of Job, PyTorchJob, JobSet"):
        playbook.render_target({"kind": "CronJob"}, {})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("10m", timedelta(minutes=10)),
        ("24h", timedelta(hours=24)),
        ("7d", timedelta(days=7)),
        ("1h30m", timedelta(minutes=90)),
        ("1d2h3m4s", timedelta(days=1, seconds=7384)),
    ],
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text", ["", "10", "10x", "30m1h", "1h 30m", "-5m", "1.5h", "h", "1h30", "99999999999d"]
)
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


# --- every error, with its file:line -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            """\
            match: ['alertname="A"']
            stpes: []
            steps: [{action: test.notify}]
            """,
            [f"pb.yaml:5: unknown key 'stpes' in playbook (allowed: {ROOT_KEYS}target, verify)"],
            id="unknown-root-key",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            steps:
              - action: test.drain
                with: {node: gpu-01}
                wtih: {reason: x}
            """,
            ["pb.yaml:8: steps[0]: unknown key 'wtih' in step (allowed: action, approval, name, when, with)"],
            id="unknown-step-key",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            budget:
              attempts: three
            steps: [{action: test.notify}]
            """,
            ["pb.yaml:6: budget.attempts: expected integer, got string 'three'"],
            id="wrong-type",
        ),
        pytest.param(
            """\
            match: alertname="A"
            steps: [{action: test.notify}]
            """,
            ["pb.yaml:4: match: expected list, got string 'alertname=\"A\"'"],
            id="match-not-a-list",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            steps: {action: test.notify}
            """,
            ["pb.yaml:5: steps: expected list, got mapping"],
            id="steps-not-a-list",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            budget: {attempts: 0}
            steps: [{action: test.notify}]
            """,
            ["pb.yaml:5: budget.attempts: must be at least 1, got 0"],
            id="attempts-minimum",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            cooldown: 10x
            steps: [{action: test.notify}]
            """,
            ["pb.yaml:5: cooldown: bad duration '10x' (expected e.g. 30s, 10m, 24h, 7d or 1h30m)"],
            id="bad-duration",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            cooldown: 30
            steps: [{action: test.notify}]
            """,
            ["pb.yaml:5: cooldown: expected string, got integer 30"],
            id="duration-without-unit",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            budget: {window: 0s}
            verify: {promql: up, interval: 0m}
            steps: [{action: test.notify}]
            """,
            [
                "pb.yaml:5: budget.window: must be longer than 0s",
                "pb.yaml:6: verify.interval: must be longer than 0s",
            ],
            id="zero-durations",
        ),
        pytest.param(
            """\
            match: []
            steps: [{action: test.notify}]
            """,
            ["pb.yaml:4: match: must not be empty"],
            id="empty-match",
        ),
        pytest.param(
            """\
            match: ['{}']
            steps: [{action: test.notify}]
            """,
            ["pb.yaml:4: match: names no matcher: a playbook must not match every alert"],
            id="match-without-matchers",
        ),
        pytest.param(
            """\
            steps: [{action: test.notify}]
            """,
            ["pb.yaml:1: missing required key 'match' in playbook"],
            id="missing-required-key",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            serialize: node
            target: {job: "{{ labels.job }}"}
            steps: [{action: test.notify}]
            """,
            ["pb.yaml:5: serialize: 'node' needs target.node"],
            id="serialize-needs-target-key",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            serialize: pod
            steps: [{action: test.notify}]
            """,
            ["pb.yaml:5: serialize: 'pod' is not one of: node, job, none"],
            id="serialize-choice",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            target: {host: "{{ labels.host }}"}
            steps: [{action: test.notify}]
            """,
            [
                "pb.yaml:5: target: unknown key 'host' in target "
                "(allowed: cluster, job, kind, namespace, node, partition, pod, scheduler)"
            ],
            id="unknown-target-key",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            target:
              scheduler: slrum
              kind: CronJob
              node: "{{ target.node }}"
              namespace: Training
            steps: [{action: test.notify}]
            """,
            [
                "pb.yaml:6: target.scheduler: 'slrum' is not one of slurm, kubernetes, none",
                "pb.yaml:7: target.kind: 'CronJob' is not one of Job, PyTorchJob, JobSet, TrainJob",
                "pb.yaml:8: target.node: template: column 1: unknown namespace 'target' "
                "(allowed here: labels, annotations)",
                "pb.yaml:9: target.namespace: 'Training' does not match the pattern "
                "[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?",
            ],
            id="target-values",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            steps:
              - action: test.drian
            """,
            [
                "pb.yaml:6: steps[0].action: unknown action 'test.drian' "
                "(known: test.drain, test.job_log, test.notify, test.requeue)"
            ],
            id="unknown-action",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            steps:
              - action: test.drain
                with:
                  node: gpu-01
                  nod: gpu-01
            """,
            [
                "pb.yaml:9: steps[0].with: unknown key 'nod' in parameters of test.drain "
                "(allowed: node, reason)"
            ],
            id="undeclared-with-key",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            steps:
              - action: test.drain
            """,
            ["pb.yaml:6: steps[0]: missing required key 'with' in a test.drain step"],
            id="required-params-without-with",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            steps:
              - action: test.drain
                with: {reason: maintenance}
            """,
            ["pb.yaml:7: steps[0].with: missing required key 'node' in parameters of test.drain"],
            id="missing-required-param",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            steps:
              - action: test.requeue
                with:
                  job: 12 34
                  hold: maybe
              - action: test.notify
                with:
                  channel: sms
                  tags:
                    - ok
                    - "not ok"
                    - "{{ labels.x }}"
            """,
            [
                "pb.yaml:8: steps[0].with.job: '12 34' does not match the pattern "
                "[0-9]{1,12}(?:[_+][0-9]{1,8})?",
                "pb.yaml:9: steps[0].with.hold: expected true or false, got 'maybe'",
                "pb.yaml:12: steps[1].with.channel: 'sms' is not one of ops, ml",
                "pb.yaml:15: steps[1].with.tags[1]: 'not ok' does not match the pattern [a-z0-9:]+",
            ],
            id="literal-values-fail-their-params",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            steps:
              - action: test.drain
                with: {node: "{{ target.node }}", reason: "Xid {{ lables.xid }}"}
            """,
            [
                "pb.yaml:7: steps[0].with.reason: template: column 5: unknown namespace 'lables' "
                "(allowed here: labels, annotations, target, diagnosis, incident)"
            ],
            id="template-in-with",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            steps:
              - action: test.drain
                with: {node: "{{ target.node | lower }}"}
            """,
            [
                "pb.yaml:7: steps[0].with.node: template: column 1: bad key 'node | lower' in "
                "{{ target.node | lower }} (a key is a name like Hostname or slurm_job_id; templates "
                "substitute values only, no expressions or filters)"
            ],
            id="template-filter",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            recheck: 'up{instance="x"} > {{ labels.threshold }}'
            verify:
              promql: "up{instance='{{ labels.instance }}'}"
            steps: [{action: test.notify}]
            """,
            [
                "pb.yaml:5: recheck: template: column 20: {{ labels.threshold }} is outside a double-quoted "
                'string; in PromQL a reference must sit inside a "..." literal, e.g. '
                '{instance="{{ labels.instance }}"}',
                "pb.yaml:7: verify.promql: template: column 14: {{ labels.instance }} is outside a "
                'double-quoted string; in PromQL a reference must sit inside a "..." literal, e.g. '
                '{instance="{{ labels.instance }}"}',
            ],
            id="promql-outside-quotes",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            verify: {timeout: 5m}
            steps: [{action: test.notify}]
            """,
            ["pb.yaml:5: verify: missing required key 'promql' in verify"],
            id="verify-without-promql",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            collect:
              - action: test.job_log
                with: {job: "{{ target.job }}"}
              - action: test.drain
                with: {node: "{{ target.node }}"}
            """,
            [
                "pb.yaml:8: collect[1].action: collect steps must be read-only; test.drain changes things "
                "(move it to steps)"
            ],
            id="collect-read-only",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            steps: []
            collect: []
            """,
            ["pb.yaml:5: steps: a playbook needs at least one step (in steps or collect)"],
            id="empty-steps-and-collect",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            """,
            ["pb.yaml:1: a playbook needs at least one step (in steps or collect)"],
            id="no-steps-at-all",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            steps:
              - action: test.notify
                approval: yes
              - action: test.notify
                when: ['diagnosis=~"gpu_.*']
            """,
            [
                "pb.yaml:7: steps[0].approval: True is not one of: required, none",
                "pb.yaml:9: steps[1].when[0]: bad matcher 'diagnosis=~\"gpu_.*': "
                '11:18: "gpu_.*: missing end "',
            ],
            id="approval-and-when",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            steps: [{action: test.notify}]
            steps: [{action: test.notify}]
            """,
            ["pb.yaml:6: steps: duplicate key 'steps'"],
            id="duplicate-yaml-key",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            steps: &loop [*loop]
            """,
            ["pb.yaml:5: steps[0]: an alias refers to itself"],
            id="recursive-alias",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            ? [a, b]
            : 1
            steps: [{action: test.notify}]
            """,
            ["pb.yaml:5: document: a key must be a plain string"],
            id="non-string-key",
        ),
        pytest.param(
            """\
            match: ['alertname="A"']
            steps: [{action: test.notify}]
            when: !!python/object:os.system ls
            """,
            [
                "pb.yaml:6: unsupported YAML: could not determine a constructor for the tag "
                "'tag:yaml.org,2002:python/object:os.system'"
            ],
            id="unsafe-tag",
        ),
    ],
)
def test_error_names_file_and_line(body, expected):
    assert errors_of(case(body)) == expected


def test_bad_matcher_points_at_its_item():
    [error] = errors_of(case('match:\n  - alertname="A"\n  - xid=~"("\nsteps: [{action: test.notify}]\n'))
    assert error.startswith("pb.yaml:6: match[1]: bad matcher 'xid=~\"(\"': ")


def test_yaml_syntax_error_has_its_line():
    text = case("match: ['alertname=\"A\"']\nsteps: [{action: test.notify]\n")
    assert errors_of(text) == ["pb.yaml:5: YAML syntax error: expected ',' or '}', but got ']'"]


def test_api_version_and_kind():
    assert errors_of("apiVersion: v2\nkind: Playbook\nmetadata: {name: p}\nmatch: ['a=\"b\"']\n") == [
        "pb.yaml:1: apiVersion: expected 'nightshift/v1', got 'v2'",
        "pb.yaml:1: a playbook needs at least one step (in steps or collect)",
    ]
    # Another kind in a playbook file gets one clear error, not one per key it does not share.
    assert errors_of("apiVersion: nightshift/v1\n\nkind: Permissions\nallow: []\n") == [
        "pb.yaml:3: kind: expected 'Playbook', got 'Permissions'"
    ]


def test_bad_name():
    assert errors_of(
        HEAD.replace("{name: p}", "{name: Bad Name!}") + "match: ['a=\"b\"']\nsteps: [{action: test.notify}]"
    ) == [
        "pb.yaml:3: metadata.name: bad playbook name 'Bad Name!' "
        "(must match ^[a-z0-9](?:[-a-z0-9_.]{0,61}[a-z0-9])?$)"
    ]


def test_every_error_of_every_document_is_reported_at_once():
    text = FULL + textwrap.dedent(
        """\
        ---
        apiVersion: nightshift/v1
        kind: Playbook
        metadata: {name: bad, descripton: x}
        match: ['alertname="A"', 'xid=~"("']
        budget: {attempts: three, backoff: 10x}
        steps:
          - action: test.drian
          - action: test.requeue
            with: {job: "12 34"}
        on_resolved: {}
        ---
        apiVersion: nightshift/v1
        kind: Playbook
        metadata: {name: worse}
        match: ['alertname="B"']
        cooldown: forever
        """
    )
    assert errors_of(text) == [
        "pb.yaml:30: metadata: unknown key 'descripton' in metadata (allowed: description, name)",
        'pb.yaml:31: match[1]: bad matcher \'xid=~"("\': invalid regular expression in matcher xid=~"(": '
        "missing closing )",
        "pb.yaml:32: budget.attempts: expected integer, got string 'three'",
        "pb.yaml:32: budget.backoff: bad duration '10x' (expected e.g. 30s, 10m, 24h, 7d or 1h30m)",
        "pb.yaml:34: steps[0].action: unknown action 'test.drian' "
        "(known: test.drain, test.job_log, test.notify, test.requeue)",
        "pb.yaml:36: steps[1].with.job: '12 34' does not match the pattern [0-9]{1,12}(?:[_+][0-9]{1,8})?",
        "pb.yaml:37: on_resolved: expected list, got mapping",
        "pb.yaml:39: a playbook needs at least one step (in steps or collect)",
        "pb.yaml:43: cooldown: bad duration 'forever' (expected e.g. 30s, 10m, 24h, 7d or 1h30m)",
    ]


def test_duplicate_names_in_one_text():
    text = case("match: ['a=\"b\"']\nsteps: [{action: test.notify}]\n---\n") + case(
        "match: ['a=\"c\"']\nsteps: [{action: test.notify}]\n"
    )
    assert errors_of(text) == ["pb.yaml:7: duplicate playbook name 'p' (first defined at pb.yaml:1)"]


# --- loading files -----------------------------------------------------------------------------------------


def _write(path, name: str, alertname: str = "A") -> None:
    path.write_text(
        f"apiVersion: nightshift/v1\nkind: Playbook\nmetadata: {{name: {name}}}\n"
        f"match: ['alertname=\"{alertname}\"']\nsteps: [{{action: test.notify}}]\n"
    )


def test_load_reads_yaml_files_of_a_directory_sorted_and_not_recursively(tmp_path):
    _write(tmp_path / "b.yml", "second")
    _write(tmp_path / "a.yaml", "first")
    _write(tmp_path / "notes.txt", "ignored-text")
    _write(tmp_path / ".swap.yaml", "ignored-hidden")
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub" / "c.yaml", "ignored-nested")
    extra = tmp_path / "sub" / "extra.yaml"
    _write(extra, "third")
    playbooks = load_playbooks([tmp_path, str(extra)], REGISTRY)
    assert [p.name for p in playbooks.playbooks] == ["first", "second", "third"]
    assert [p.source for p in playbooks.playbooks] == [
        str(tmp_path / "a.yaml"),
        str(tmp_path / "b.yml"),
        str(extra),
    ]


def test_load_collects_errors_of_every_file_and_duplicates_across_files(tmp_path):
    _write(tmp_path / "a.yaml", "same")
    _write(tmp_path / "b.yaml", "same", alertname="B")
    (tmp_path / "c.yaml").write_text(
        case("match: ['a=\"b\"']\ncooldown: soon\nsteps: [{action: test.notify}]\n")
    )
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PlaybookError) as caught:
        load_playbooks([tmp_path, missing], REGISTRY)
    assert isinstance(caught.value, ConfigError)
    assert caught.value.errors == [
        f"{tmp_path / 'c.yaml'}:5: cooldown: bad duration 'soon' (expected e.g. 30s, 10m, 24h, 7d or 1h30m)",
        f"{missing}: no such file or directory",
        f"{tmp_path / 'b.yaml'}:1: duplicate playbook name 'same' (first defined at {tmp_path / 'a.yaml'}:1)",
    ]


def test_load_reports_a_file_that_is_not_utf8(tmp_path):
    (tmp_path / "a.yaml").write_bytes(b"\xff\xfe garbage")
    with pytest.raises(PlaybookError, match=r"a\.yaml: cannot read: "):
        load_playbooks([tmp_path], REGISTRY)


def test_an_empty_directory_loads_no_playbooks(tmp_path):
    assert len(load_playbooks([tmp_path], REGISTRY)) == 0


# --- YAML documents ----------------------------------------------------------------------------------------


def test_read_documents_keeps_lines_keys_as_written_and_merges():
    text = textwrap.dedent(
        """\
        base: &base {action: test.notify, approval: none}
        on: yes
        steps:
          - <<: *base
            name: merged
          - *base
        ---
        ---
        x: 1
        """
    )
    documents, errors = read_documents(text, "d.yaml")
    assert errors == []
    first, second = documents
    assert first.data["on"] is True  # the key stays "on"; values follow YAML as usual
    assert first.data["steps"][0] == {"action": "test.notify", "approval": "none", "name": "merged"}
    assert first.data["steps"][1] is first.data["base"]  # an alias is converted once and shared
    # An alias item is the anchored node itself, so it points at the anchor, where its content is written.
    assert (first.line_of(("steps", 0, "name")), first.line_of(("steps", 1)), first.line_of(("on",))) == (
        5,
        1,
        2,
    )
    assert first.line_of(("steps", 0, "name", "deeper")) == 5  # nearest recorded ancestor
    assert (second.line, second.data) == (9, {"x": 1})


def test_aliases_cannot_expand_into_a_huge_document():
    # Each level repeats the previous one nine times: 9**9 values for jsonschema to walk, unless stopped.
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    documents, errors = read_documents("\n".join(levels), "lol.yaml")
    assert (documents, errors) == ([], ["lol.yaml:1: more than 100000 values once aliases are expanded"])


# --- matching ----------------------------------------------------------------------------------------------


def _playbook(name: str, *matchers: str) -> Playbook:
    return Playbook(
        name=name,
        description="",
        match=tuple(parse_matchers(", ".join(matchers))),
        target={},
        serialize="none",
    )


def test_match_checks_every_matcher_and_orders_by_name():
    playbooks = PlaybookSet(
        [
            _playbook("z-xid", 'alertname="GpuXidError"', 'xid=~"79|48"'),
            _playbook("a-xid-any", 'alertname="GpuXidError"'),
            _playbook("m-regex-alertname", 'alertname=~"Gpu.*"', 'severity="critical"'),
            _playbook("other", 'alertname="NcclTimeout"'),
        ]
    )
    labels = {"alertname": "GpuXidError", "xid": "79", "severity": "critical"}
    assert [p.name for p in playbooks.match(labels)] == ["a-xid-any", "m-regex-alertname", "z-xid"]
    assert [p.name for p in playbooks.match({"alertname": "GpuXidError", "xid": "13"})] == ["a-xid-any"]
    assert playbooks.match({"alertname": "Unknown"}) == []
    assert playbooks.get("other") is playbooks.playbooks[2]
    assert playbooks.get("missing") is None


def test_match_is_indexed_by_alertname():
    many = [_playbook(f"pb-{i:05d}", f'alertname="Alert{i}"', 'severity!="none"') for i in range(10_000)]
    unindexed = [
        _playbook("any-gpu", 'alertname=~"Alert.*"', 'gpu="3"'),
        _playbook("no-alertname", 'gpu="3"'),
    ]
    playbooks = PlaybookSet(many + unindexed)
    assert [p.name for p in playbooks.match({"alertname": "Alert4242", "gpu": "3"})] == [
        "any-gpu",
        "no-alertname",
        "pb-04242",
    ]
    assert playbooks.candidates_examined == 1 + len(unindexed)
    assert playbooks.match({"gpu": "3"}) == [
        unindexed[1]
    ]  # missing alertname is "": only unindexed candidates
    assert playbooks.candidates_examined == 1 + 2 * len(unindexed)


def test_playbook_names_must_be_unique_in_a_set():
    with pytest.raises(ValueError, match="unique"):
        PlaybookSet([_playbook("a", 'x="1"'), _playbook("a", 'x="2"')])


# --- JSON schema -------------------------------------------------------------------------------------------


def test_schema_is_valid_draft_2020_12_and_knows_each_action():
    schema = playbook_schema(REGISTRY)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    [document], _ = read_documents(FULL, "gpu.yaml")
    assert list(validator.iter_errors(document.data)) == []
    rules = {
        rule["if"]["properties"]["action"]["const"]: rule["then"] for rule in schema["$defs"]["step"]["allOf"]
    }
    assert sorted(rules) == REGISTRY.names()
    assert rules["test.drain"]["required"] == ["with"]
    assert rules["test.drain"]["properties"]["with"]["required"] == ["node"]
    assert "required" not in rules["test.notify"]
    assert (
        rules["test.requeue"]["properties"]["with"]["properties"]["hold"]
        == Param(kind="boolean").json_schema()
    )


def test_shipped_schema_is_the_generated_one():
    shipped = json.loads(SCHEMA_PATH.read_text())
    assert shipped == playbook_schema(default_registry()), (
        "app/schema/playbook.schema.json is stale: regenerate it with "
        "`.venv/bin/python -c 'from app.actions import default_registry; "
        "from app.domain.playbooks import SCHEMA_PATH, write_schema; write_schema(SCHEMA_PATH, default_registry())'`"
    )


def test_write_schema_is_stable_json(tmp_path):
    write_schema(tmp_path / "s.json", REGISTRY)
    text = (tmp_path / "s.json").read_text()
    assert json.loads(text) == playbook_schema(REGISTRY)
    assert text == json.dumps(playbook_schema(REGISTRY), indent=2, sort_keys=True) + "\n"


def test_a_notify_url_must_be_written_out_not_templated():
    text = case(
        """\
        match: ['alertname="A"']
        steps:
          - action: notify.webhook
            with: {url: "https://{{ labels.hook }}/x", text: "Xid on {{ labels.Hostname }}"}
        """
    )
    with pytest.raises(PlaybookError) as caught:
        parse_playbooks(text, "pb.yaml", default_registry())
    assert caught.value.errors == [
        "pb.yaml:7: steps[0].with.url: must be written out in the playbook, not templated (it says where data is sent)"
    ]
    [loaded] = parse_playbooks(
        text.replace("{{ labels.hook }}", "chat.example"), "pb.yaml", default_registry()
    )
    assert loaded.steps[0].with_["url"] == "https://chat.example/x"  # the text may still be templated


def test_a_target_is_rendered_once_for_alerts_that_agree_on_what_its_templates_read(monkeypatch):
    playbook = replace(
        _playbook("node-fault", 'alertname="GpuXidError"'),
        target={"scheduler": "slurm", "node": "{{ labels.Hostname }}", "job": "{{ labels.slurm_job_id }}"},
    )
    rendered: list[str] = []
    real = playbooks_module.render

    def render(text, context, **kwargs):
        rendered.append(text)
        return real(text, context, **kwargs)

    monkeypatch.setattr(playbooks_module, "render", render)
    rank = {"alertname": "GpuXidError", "Hostname": "node1", "slurm_job_id": "42", "rank": "0"}
    first = playbook.render_target(rank, {})
    assert playbook.render_target({**rank, "rank": "7"}, {"summary": "x"}) == first  # reads neither
    assert len(rendered) == 3  # one rendering of the three values
    first["node"] = "changed by a caller"
    assert playbook.render_target(rank, {})["node"] == "node1"  # a copy is handed out
    assert playbook.render_target({**rank, "Hostname": "node2"}, {})["node"] == "node2"
    bad = {**rank, "Hostname": "node 1;reboot"}
    for _ in range(2):  # a value its pattern refuses raises every time, never remembered
        with pytest.raises(ParamError):
            playbook.render_target(bad, {})


def test_the_targets_a_playbook_remembers_are_bounded(monkeypatch):
    monkeypatch.setattr(playbooks_module, "MAX_REMEMBERED_TARGETS", 3)
    playbook = replace(
        _playbook("node-fault", 'alertname="GpuXidError"'), target={"node": "{{ labels.Hostname }}"}
    )
    for i in range(10):
        assert playbook.render_target({"alertname": "GpuXidError", "Hostname": f"node{i}"}, {}) == {
            "node": f"node{i}"
        }
        assert len(playbook._targets) <= 3
