"""Value-only templates: parsing errors with columns, rendering, and PromQL string-literal escaping."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.templates import (
    TemplateError,
    check_promql_template,
    check_template,
    is_templated,
    render,
    render_promql,
    render_value,
    template_refs,
)
from tests.fixtures.procs import require_binary

INJECTION = '"} or vector(1) or {x="'
CONTEXT = {
    "labels": {"Hostname": "gpu-07", "xid": "79", "evil": INJECTION},
    "annotations": {"summary": "GPU fell off the bus"},
    "target": {"node": "gpu-07", "job": "1234"},
    "diagnosis": {"kind": "gpu_fell_off_bus"},
    "incident": {"id": 42},
}


def test_refs_in_order_with_optional_whitespace():
    text = "{{labels.Hostname}} {{ target.job }}{{   diagnosis.kind}} {{incident.id  }}"
    assert template_refs(text) == [
        ("labels", "Hostname"),
        ("target", "job"),
        ("diagnosis", "kind"),
        ("incident", "id"),
    ]


def test_plain_text_has_no_refs():
    assert template_refs("drain for Xid 79 (see runbook)") == []
    check_template("single { braces } are text")


@pytest.mark.parametrize(
    ("text", "column", "fragment"),
    [
        ("Xid {{ lables.xid }}", 5, "unknown namespace 'lables'"),
        ("ab {{ labels.xid ", 4, "unclosed '{{'"),
        ("{{ labels.1xid }}", 1, "bad key '1xid'"),
        ("{{ labels.a-b }}", 1, "bad key 'a-b'"),
        ("{{ labels.xid | upper }}", 1, "no expressions or filters"),
        ("x{{ labels }}", 2, "expected {{ namespace.key }}, got {{ labels }}"),
        ("{{}}", 1, "expected {{ namespace.key }}"),
        ("{{ labels.a.b }}", 1, "bad key 'a.b'"),
        ("ok {{ labels.a }} then {{ env.HOME }}", 24, "unknown namespace 'env'"),
    ],
)
def test_check_template_reports_the_column(text, column, fragment):
    with pytest.raises(TemplateError) as caught:
        check_template(text)
    assert caught.value.column == column
    assert str(caught.value).startswith(f"column {column}: ")
    assert fragment in str(caught.value)


def test_check_template_restricts_namespaces():
    check_template("{{ labels.a }}{{ annotations.b }}", ("labels", "annotations"))
    with pytest.raises(
        TemplateError, match="unknown namespace 'target' \\(allowed here: labels, annotations\\)"
    ):
        check_template("{{ labels.a }}{{ target.node }}", ("labels", "annotations"))


def test_render_substitutes_values_and_missing_keys_render_empty():
    assert render("drain {{ target.node }} for Xid {{labels.xid}}", CONTEXT) == "drain gpu-07 for Xid 79"
    assert render("[{{ labels.nope }}][{{ annotations.none }}]", CONTEXT) == "[][]"
    assert render("incident {{ incident.id }}", CONTEXT) == "incident 42"
    assert render("{{ target.node }}", {}) == ""


def test_render_refuses_a_malformed_template():
    with pytest.raises(TemplateError):
        render("{{ labels.x ", CONTEXT)


def test_render_does_not_re_expand_values():
    # A label value that looks like a template is text, not a second round of substitution.
    assert render("{{ labels.v }}", {"labels": {"v": "{{ target.node }}"}}) == "{{ target.node }}"


def test_render_promql_escapes_for_the_string_literal():
    context = {"labels": {"v": 'a\\b"c\nd'}}
    assert render_promql('up{x="{{ labels.v }}"}', context) == 'up{x="a\\\\b\\"c\\nd"}'


def test_injection_stays_inside_the_string_literal():
    query = render_promql('up{x="{{ labels.evil }}"} == 1', CONTEXT)
    assert query == 'up{x="\\"} or vector(1) or {x=\\""} == 1'
    assert _literals(query) == [INJECTION]
    assert query.count("or vector") == 1 and query.endswith('"} == 1')


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_value_decodes_back_from_a_single_literal(value):
    query = render_promql('m{a="{{ labels.v }}",b="{{ labels.v }}"} > 0', {"labels": {"v": value}})
    assert _literals(query) == [value, value]
    assert query.startswith('m{a="') and query.endswith('"} > 0')


def test_promtool_evaluates_the_injection_as_a_plain_label_value(tmp_path):
    """Real PromQL: the escaped query selects nothing; naive substitution would fire (so this can fail)."""
    promtool = require_binary("promtool")
    # The second matcher keeps the naively spliced query valid PromQL, so the only difference is the escaping.
    template = 'up{x="{{ labels.evil }}",y!=""}'
    escaped = _promtool_fires(promtool, tmp_path / "escaped", render_promql(template, CONTEXT))
    naive = _promtool_fires(promtool, tmp_path / "naive", render(template, CONTEXT))
    assert (escaped, naive) == (False, True)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("up > {{ labels.x }}", "outside a double-quoted string"),
        ("up{x='{{ labels.x }}'}", "outside a double-quoted string"),
        ("up{x=`{{ labels.x }}`}", "outside a double-quoted string"),
        ('up{x="a"} > {{ labels.x }}', "outside a double-quoted string"),
        ('up{x="\\{{ labels.x }}"}', "right after a backslash"),
        ('up # "{{ labels.x }}"', "outside a double-quoted string"),
        ('up{x="\'"} > {{ labels.x }}', "outside a double-quoted string"),
    ],
)
def test_promql_references_must_sit_inside_double_quotes(text, fragment):
    with pytest.raises(TemplateError, match=re.escape(fragment)):
        check_promql_template(text)
    with pytest.raises(TemplateError, match=re.escape(fragment)):
        render_promql(text, CONTEXT)


@pytest.mark.parametrize(
    "text",
    [
        'up{x="{{ labels.x }}"}',
        'up{x="pre-{{ labels.x }}-{{ labels.y }}"}',
        'up{x="a\\"{{ labels.x }}"}',
        'up{x="a\\\\{{ labels.x }}"}',
        "sum(rate(x{a='q'}[5m])) # comment's quote\n" + ' and on() y{b="{{ labels.b }}"}',
        'x{a=`raw\\`} and y{b="{{ labels.b }}"}',
    ],
)
def test_promql_references_inside_double_quotes_are_accepted(text):
    check_promql_template(text)


def test_check_promql_template_checks_namespaces_too():
    with pytest.raises(TemplateError, match="unknown namespace 'lables'"):
        check_promql_template('up{x="{{ lables.x }}"}')


def test_render_value_recurses_into_lists_and_dicts():
    value = {
        "node": "{{ target.node }}",
        "tags": ["xid:{{ labels.xid }}", 3],
        "n": 5,
        "flag": True,
        "none": None,
    }
    assert render_value(value, CONTEXT) == {
        "node": "gpu-07",
        "tags": ["xid:79", 3],
        "n": 5,
        "flag": True,
        "none": None,
    }
    assert render_value(7, CONTEXT) == 7


def test_is_templated():
    assert is_templated("a {{ labels.x }}")
    assert is_templated(["a", {"k": "{{ target.node }}"}])
    assert not is_templated(["a", {"k": "b"}, 3])
    assert not is_templated(3)


def _literals(query: str) -> list[str]:
    """The decoded double-quoted string literals of ``query`` (Go escapes as PromQL's lexer reads them)."""
    escapes = {"n": "\n", "r": "\r", "\\": "\\", '"': '"'}
    found = re.findall(r'"((?:[^"\\]|\\.)*)"', query, flags=re.DOTALL)
    return [re.sub(r"\\(.)", lambda m: escapes[m.group(1)], text, flags=re.DOTALL) for text in found]


def _promtool_fires(promtool: str, directory, expr: str) -> bool:
    """Whether an alert on ``expr`` fires over a series ``up{x="a"} 1`` (promtool test rules)."""
    directory.mkdir()
    rule = {"groups": [{"name": "g", "rules": [{"alert": "Injected", "expr": expr}]}]}
    # JSON is YAML, and json.dumps quotes the query exactly, whatever quotes it holds.
    (directory / "rules.yml").write_text(json.dumps(rule))
    (directory / "test.yml").write_text(
        textwrap.dedent(
            """\
            rule_files: [rules.yml]
            evaluation_interval: 1m
            tests:
              - interval: 1m
                input_series:
                  - series: 'up{x="a"}'
                    values: '1 1 1'
                alert_rule_test:
                  - eval_time: 1m
                    alertname: Injected
                    exp_alerts: []
            """
        )
    )
    result = subprocess.run(
        [promtool, "test", "rules", "test.yml"], cwd=directory, capture_output=True, text=True, timeout=60
    )
    output = result.stdout + result.stderr
    assert "parse error" not in output, output
    fired = "got:[\n" in output and "alertname: Injected" in output
    assert result.returncode == (1 if fired else 0), output
    return fired
