"""Every command shown in README.md, docs/*.md and the folders' READMEs runs against the repository as written,
or says it is illustrative (issue 23 item 8): the docs cannot drift from the code unnoticed.

What counts as shown: each line of a code block fenced ```sh, ```bash or ```shell (continuations joined, heredoc
bodies skipped), and each ``$ ``-prompted line of a ```console block, whose following lines are the command's
output. A block with no language that starts like a command is an error (label it). A command is illustrative when
its line's comment, or a comment opening its block, says ``illustrative``: it needs a deployment (your settings,
your cluster). Checked:

- ``nightshift SUB ...``: the subcommand and every option exist (always); unless illustrative, the arguments parse
  as click parses them, from the repository's root, and the read-only commands (lint, explain, actions, diagnose)
  run offline with exit 0 or 1; a ``console`` sample's output equals the real output;
- ``make TARGET``: the Makefile has the target; ``python -m MODULE``: the module exists;
- every argument naming a path in the repository (``playbooks/...``, ``deploy/slurm/...``, ``@alerts/...``;
  ``/opt/nightshift/`` is the checkout docs/slurm.md installs) exists.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from app.cli import cli
from tests.fixtures.procs import nightshift_cli

ROOT = Path(__file__).resolve().parents[2]
GUIDES = sorted((ROOT / "docs").glob("*.md"))
# README.md, docs/*.md, and the READMEs of the repository's folders (rules/, alerts/, progress/, bench/...).
DOCS = [ROOT / "README.md", *GUIDES, *sorted(ROOT.glob("*/README.md"))]
SHELL = {"sh", "bash", "shell"}
# A block without a language whose first line starts so holds commands: it must say which shell.
COMMANDISH = re.compile(
    r"^(\$ |make |nightshift |\.venv/bin/|curl |python|CI=true |helm |kubectl |pip |sudo )"
)
TOP_DIRS = sorted(
    p.name
    for p in ROOT.iterdir()
    if p.is_dir() and not p.name.startswith(".") and p.name != "nightshift.egg-info"
)
CHECKOUT = "/opt/nightshift"  # docs/slurm.md: `git clone <this repository> /opt/nightshift`
# Read-only subcommands that run offline; the others (serve, worker, init, replay, export, inbox) are parsed only.
RUNNABLE = {"lint", "explain", "actions", "diagnose"}


@dataclass(frozen=True)
class Shown:
    doc: Path
    line: int
    text: str
    output: str | None  # a console sample's output lines
    illustrative: bool

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def fenced(doc: Path) -> list[tuple[int, str, list[str]]]:
    """(line of the first body line, info string, body lines) of each fenced block."""
    lines = doc.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = re.match(r"^\s*```\s*(\S*)", lines[i])
        if opening:
            start, body = i + 2, []
            i += 1
            while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
                body.append(lines[i])
                i += 1
            found.append((start, opening.group(1), body))
        i += 1
    return found


def _joined(body: list[str], start: int) -> list[tuple[int, str]]:
    """Logical lines: continuations joined, heredoc bodies dropped."""
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(body):
        number, text = start + i, body[i]
        while text.rstrip().endswith("\\") and i + 1 < len(body):
            i += 1
            text = text.rstrip()[:-1] + " " + body[i].strip()
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", text)
        if heredoc:
            while i + 1 < len(body) and body[i + 1].strip() != heredoc.group(1):
                i += 1
            i += 1
        out.append((number, text))
        i += 1
    return out


def shown(doc: Path) -> list[Shown]:
    commands = []
    for start, info, body in fenced(doc):
        opening = next((line for line in body if line.strip()), "")
        whole = opening.lstrip().startswith("#") and "illustrative" in opening
        if info == "console":
            entries: list[list[object]] = []
            for number, text in _joined(body, start):
                if text.startswith("$ "):
                    entries.append([number, text[2:], []])
                elif entries:
                    entries[-1][2].append(text)  # type: ignore[union-attr]
            for number, text, output in entries:
                lines: list[str] = output  # type: ignore[assignment]
                illustrative = whole or "illustrative" in _comment(str(text))
                commands.append(Shown(doc, int(str(number)), str(text), "\n".join(lines), illustrative))
        elif info in SHELL:
            for number, text in _joined(body, start):
                if text.strip() and not text.lstrip().startswith("#"):
                    commands.append(Shown(doc, number, text, None, whole or "illustrative" in _comment(text)))
    return commands


def _comment(text: str) -> str:
    """The shell comment ending ``text`` (an unquoted ``#`` after a blank), or ""."""
    quote = None
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            return text[i:]
    return ""


def simple_commands(text: str) -> list[list[str]]:
    """The simple commands of one shell line: words, with substitutions, redirections and assignments dropped."""
    text = re.sub(r"\$\([^()]*\)", "SUBST", text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    skip_next = False
    for token in lexer:
        if skip_next:
            skip_next = False
            continue
        if token in {"&&", "||", ";", "|", "&", "(", ")"}:
            commands.append([])
        elif token in {">", ">>", "<", "<<", "2>", "<<-"} or re.fullmatch(r"\d?>&?\d?", token):
            skip_next = True
        else:
            commands[-1].append(token)
    cleaned = []
    for words in commands:
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            words = words[1:]
        while words and words[0] in {"sudo", "nice", "env"}:
            words = words[1:]
            while words and words[0].startswith("-"):
                words = words[2:] if words[0] in {"-u", "-g"} else words[1:]
        if words:
            cleaned.append(words)
    return cleaned


def _nightshift_args(words: list[str]) -> list[str] | None:
    program = Path(words[0]).name
    if program == "nightshift":
        return words[1:]
    if program.startswith("python") and words[1:3] == ["-m", "app.cli"]:
        return words[3:]
    return None


def _local(token: str) -> Path | None:
    """The repository path a word names, if it names one (``path::test`` for pytest: the path)."""
    token = token.removeprefix("@").split("::", 1)[0]
    if token == CHECKOUT or token.startswith(CHECKOUT + "/"):
        return ROOT / token.removeprefix(CHECKOUT).lstrip("/")
    token = token.removeprefix("./")
    return ROOT / token if "/" in token and token.split("/", 1)[0] in TOP_DIRS else None


def _exists(path: Path) -> bool:
    text = str(path.relative_to(ROOT))
    return bool(list(ROOT.glob(text))) if any(c in text for c in "*?[") else path.exists()


def _make_targets() -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+):", (ROOT / "Makefile").read_text(), re.M)}


ALL = [command for doc in DOCS for command in shown(doc)]


def test_docs_show_commands_at_all():
    """The parametrisation below is not empty by accident."""
    by_doc = {c.doc.name for c in ALL}
    assert {"README.md", "slurm.md", "deploy.md"} <= by_doc
    assert any(c.output for c in ALL), "a console sample with its output"


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_command_blocks_say_their_shell(doc):
    unlabelled = [
        f"{doc.relative_to(ROOT)}:{start}"
        for start, info, body in fenced(doc)
        if not info and body and COMMANDISH.match(body[0].lstrip())
    ]
    assert unlabelled == [], "label these code blocks ```sh (or ```console with $ prompts)"


@pytest.mark.parametrize("command", ALL, ids=[c.where for c in ALL])
def test_every_shown_command_holds(command: Shown, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(ROOT)
    for words in simple_commands(command.text):
        for word in words[1:]:
            path = _local(word)
            if path is not None:
                assert _exists(path), f"{command.where}: {word}: no such path in the repository"
        program = Path(words[0]).name
        if program == "make":
            targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
            assert set(targets) <= _make_targets(), f"{command.where}: no make target {targets}"
        elif program.startswith("python") and words[1:2] == ["-m"] and words[2] != "app.cli":
            assert importlib.util.find_spec(words[2]) is not None, f"{command.where}: no module {words[2]}"
        args = _nightshift_args(words)
        if args is not None:
            _check_nightshift(command, [_mapped(a) for a in args])


def _mapped(word: str) -> str:
    return str(ROOT / word.removeprefix(CHECKOUT).lstrip("/")) if word.startswith(CHECKOUT) else word


def _check_nightshift(command: Shown, args: list[str]) -> None:
    if args in (["--version"], ["--help"]):
        return
    name = next((a for a in args if not a.startswith("-")), None)
    assert name in cli.commands, (
        f"{command.where}: no subcommand {name!r} (nightshift {', '.join(cli.commands)})"
    )
    sub = cli.commands[name]
    rest = args[args.index(name) + 1 :]
    options = {opt for param in sub.params for opt in (*param.opts, *param.secondary_opts)} | {"--help"}
    for word in rest:
        if word.startswith("-") and word != "-":
            assert word.split("=", 1)[0] in options, f"{command.where}: nightshift {name} has no {word}"
    if command.illustrative:
        return
    try:
        sub.make_context(name, list(rest))
    except click.ClickException as exc:
        raise AssertionError(
            f"{command.where}: nightshift {' '.join(args)}: {exc.format_message()}"
        ) from None
    if name in RUNNABLE:
        done = nightshift_cli(*args)
        assert done.returncode in (0, 1), f"{command.where}: exit {done.returncode}: {done.stderr}"
        if command.output is not None:
            assert (done.stdout + done.stderr).rstrip("\n") == command.output.rstrip("\n"), (
                f"{command.where}: the sample differs from the real output; it is now:\n{done.stdout}"
            )


def test_every_doc_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    missing = [d.name for d in GUIDES if f"docs/{d.name})" not in readme]
    assert missing == []


def test_the_parsing_finds_what_it_must():
    assert simple_commands("CI=true .venv/bin/pytest tests/e2e -q  # x") == [
        [".venv/bin/pytest", "tests/e2e", "-q"]
    ]
    assert simple_commands('a && sudo -u ns ssh host "x y" > out; make demo') == [
        ["a"],
        ["ssh", "host", "x y"],
        ["make", "demo"],
    ]
    assert _local("@alerts/examples/gpu-xid-79.json") == ROOT / "alerts/examples/gpu-xid-79.json"
    assert _local("/opt/nightshift/playbooks") == ROOT / "playbooks" and _local("/etc/x") is None


def test_the_readme_and_the_cli_docstring_list_every_subcommand():
    import app.cli

    line = (ROOT / "README.md").read_text().split("## CLI", 1)[1].split("`", 2)[1]
    listed = {word for word in re.split(r"[\s|]+", line) if word in cli.commands}
    assert listed == set(cli.commands)
    docstring = app.cli.__doc__ or ""
    assert [name for name in cli.commands if name not in docstring] == []


def test_the_kubernetes_action_table_lists_every_kubernetes_action():
    from app.actions import default_registry

    table = (ROOT / "docs" / "kubernetes.md").read_text()
    names = [a.name for a in default_registry() if a.name.startswith("kubernetes.")]
    assert names and [name for name in names if f"| `{name}` |" not in table] == []
