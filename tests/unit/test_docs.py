"""The README and the docs/ pages show only what is true of the code.

Every page is found by glob, so a page added later is checked too:

- every ``console`` block is ``$ ``-prefixed command lines followed by their output;
- every ``pycni`` command in a ``console`` or shell block parses against the real click command
  tree (the verb exists, each option exists for it, the arguments fit), with click's own parser;
- the cheap and harmless ones (help, versions, ``plugins list``, ``nomad conflist``, ``conf`` on
  a file of the repository) are run, and their output must match what the page shows (doctest's ``...``);
- every ``pycon`` block runs as a doctest (a page's blocks share one namespace, in order);
  a ``python`` block is an illustration that is not run, and must at least compile;
- every relative link resolves, anchors included, and the README links every page.
"""

from __future__ import annotations

import contextlib
import doctest
import re
import shlex
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs
import click
import pytest
from click.testing import CliRunner, Result

from pycni.cli import cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = {"sh", "shell", "bash", "console"}
# Commands run for real: they read files and print, and change nothing on the machine.
RUN_ANYWHERE = {(), ("version",), ("plugins", "list"), ("nomad", "conflist")}
RUN_ON_REPO_FILES = {("conf", "list"): "conf_dir", ("conf", "show"): "conf_dir", ("conf", "validate"): "path"}
CONTROL = {"&&", "||", "|", ";", "&"}
CHECKER = doctest.OutputChecker()


@attrs.frozen
class Block:
    page: Path
    line: int
    lang: str
    body: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@attrs.frozen
class Command:
    block: Block
    text: str
    output: str


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a page, de-indented (a fence may sit in a list item)."""
    found = []
    text = page.read_text()
    fence = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
    for m in fence.finditer(text):
        indent = len(m["indent"])
        body = "".join(line[indent:] for line in m["body"].splitlines(keepends=True))
        lang = m["info"].split()[0] if m["info"].strip() else ""
        found.append(Block(page, text.count("\n", 0, m.start()) + 1, lang, body))
    return found


def all_blocks(*langs: str) -> list[Block]:
    return [b for page in PAGES for b in blocks(page) if b.lang in langs]


def console_commands(block: Block) -> list[Command]:
    """``$ `` lines (a trailing backslash continues one) and the output lines after each."""
    commands: list[Command] = []
    text: list[str] = []
    output: list[str] = []
    lines = iter(block.body.splitlines())
    for line in lines:
        if line.startswith("$ "):
            if text:
                commands.append(Command(block, " ".join(text), "".join(output)))
            text, output = [line[2:]], []
            while text[-1].endswith("\\"):
                text[-1] = text[-1][:-1]
                text.append(next(lines, ""))
        elif text:
            output.append(line + "\n")
    if text:
        commands.append(Command(block, " ".join(text), "".join(output)))
    return commands


def shell_commands(block: Block) -> list[Command]:
    if block.lang == "console":
        return console_commands(block)
    return [Command(block, line, "") for line in block.body.replace("\\\n", " ").splitlines() if line.strip()]


def pycni_invocations(command: str) -> Iterator[list[str]]:
    """The argument lists of each ``pycni`` run in a shell command line (also after ``&&``,
    ``|``, ``sudo``, ``env VAR=...`` or as ``python -m pycni``)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    segment: list[str] = []
    redirect = False
    for token in [*lexer, ";"]:
        if redirect:  # the file of `> FILE`, `2>&1`, `< FILE`: not an argument
            redirect = False
            continue
        if re.fullmatch(r"&?[<>]+&?", token):
            redirect = True
            if segment and segment[-1].isdigit():
                segment.pop()  # the fd of `2>`
            continue
        if token not in CONTROL:
            segment.append(token)
            continue
        words = segment
        segment = []
        while words and (words[0] in ("sudo", "env") or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0])):
            words = words[1:]
        if words and Path(words[0]).name == "pycni":
            yield words[1:]
        elif len(words) >= 3 and Path(words[0]).name.startswith("python") and words[1:3] == ["-m", "pycni"]:
            yield words[3:]


def parse(args: list[str]) -> tuple[tuple[str, ...], dict[str, object]]:
    """Walk the command tree with click's parser: the verb path and the last verb's values.
    Raises ``click.UsageError`` (unknown verb or option, missing or extra arguments)."""
    command: click.Command = cli
    ctx = click.Context(cli, info_name="pycni")
    path: tuple[str, ...] = ()
    while True:
        values, rest, _ = command.make_parser(ctx).parse_args(list(args))
        if isinstance(command, click.Group) and rest:
            sub = command.get_command(ctx, rest[0])
            if sub is None:
                raise click.UsageError(f"no such command {' '.join(('pycni', *path, rest[0]))!r}")
            path += (rest[0],)
            command, ctx, args = sub, click.Context(sub, parent=ctx, info_name=rest[0]), rest[1:]
            continue
        break
    if values.get("help") or values.get("version"):
        return path, values
    if rest:
        raise click.UsageError(f"extra arguments {rest} for 'pycni {' '.join(path)}'")
    for param in command.params:
        name = param.name or ""
        if param.required and (name not in values or param.value_is_missing(values[name])):
            raise click.UsageError(f"'pycni {' '.join(path)}' is missing {param.human_readable_name}")
    return path, values


def runnable(path: tuple[str, ...], values: dict[str, object]) -> bool:
    if values.get("help") or values.get("version") or path in RUN_ANYWHERE:
        return True
    name = RUN_ON_REPO_FILES.get(path)
    target = values.get(name) if name else None
    if values.get("check_plugins"):  # `conf validate --plugins` finds (and may exec) plugins
        return False
    return isinstance(target, str) and not Path(target).is_absolute() and (ROOT / target).exists()


def runnable_args(args: list[str]) -> bool:
    try:
        return runnable(*parse(args))
    except click.UsageError:
        return False  # reported by test_pycni_commands_in_the_docs_parse_against_the_cli


def run(args: list[str]) -> Result:
    # The runtime's environment variables would change what the commands read.
    unset = ("NETCONFPATH", "CNI_PATH", "PYCNI_BACKEND", "PYCNI_CACHE_DIR", "PYCNI_STATE_DIR", "PYCNI_SOCKET")
    with contextlib.chdir(ROOT):
        return CliRunner().invoke(cli, args, prog_name="pycni", env=dict.fromkeys(unset), terminal_width=80)


COMMANDS = [(c, args) for b in all_blocks(*SHELLS) for c in shell_commands(b) for args in pycni_invocations(c.text)]


def test_console_blocks_are_prompted_commands_and_their_output() -> None:
    bad = [
        b.where
        for b in all_blocks("console")
        if not b.body.strip() or not b.body.lstrip().startswith("$ ") or not console_commands(b)
    ]
    assert bad == [], "a console block starts with a `$ ` command line"


@pytest.mark.parametrize(("command", "args"), COMMANDS, ids=[f"{c.block.where}:{' '.join(a)}" for c, a in COMMANDS])
def test_pycni_commands_in_the_docs_parse_against_the_cli(command: Command, args: list[str]) -> None:
    try:
        parse(args)
    except click.UsageError as e:
        pytest.fail(f"{command.block.where}: `{command.text}`: {e.format_message()}")


def test_the_docs_show_pycni_commands_and_run_some() -> None:
    # The checks above must have something to check: the pages show commands, some run here.
    ran = [args for _, args in COMMANDS if runnable_args(args)]
    assert len(COMMANDS) >= 20
    assert len(ran) >= 3


@pytest.mark.parametrize(
    ("command", "args"),
    [(c, a) for c, a in COMMANDS if runnable_args(a)],
    ids=[f"{c.block.where}:{' '.join(a)}" for c, a in COMMANDS if runnable_args(a)],
)
def test_harmless_commands_in_the_docs_print_what_the_docs_show(command: Command, args: list[str]) -> None:
    result = run(args)
    where = f"{command.block.where}: `{command.text}`"
    if command.output:
        flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
        assert CHECKER.check_output(command.output, result.output, flags), (
            f"{where} prints:\n{result.output}\nnot what the page shows:\n{command.output}"
        )
    else:
        assert result.exit_code == 0, f"{where} failed: {result.output}"


def test_parse_rejects_what_the_cli_rejects() -> None:
    # The checker itself: each of these is a mistake a page could make.
    for args in (
        ["nosuch"],
        ["add", "net"],
        ["add", "net", "/run/netns/x", "--bogus"],
        ["plugins", "lst"],
        ["version", "bridge", "extra"],
        ["nomad", "ports"],
        ["conf", "list", "--conf-dir"],
    ):
        with pytest.raises(click.UsageError):
            parse(args)
    assert parse(["conf", "show", "nomad", "--conf-dir", "x"]) == (("conf", "show"), {"conf_dir": "x", "name": "nomad"})
    assert list(pycni_invocations("sudo .venv/bin/pycni demo --json | less && FOO=1 pycni version  # hi")) == [
        ["demo", "--json"],
        ["version"],
    ]
    assert list(pycni_invocations("pycni conf list >nets.json 2>&1; python3 -m pycni -h </dev/null")) == [
        ["conf", "list"],
        ["-h"],
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pycon_blocks_run_as_doctests(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # tempfile.mkdtemp() in a page lands under this test's tmp_path, so nothing is left behind.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    globs: dict[str, object] = {"__name__": "__docs__"}
    for block in blocks(page):
        if block.lang != "pycon":
            continue
        test = parser.get_doctest(block.body, globs, block.where, str(page), block.line)
        assert test.examples, f"{block.where}: a pycon block without >>> examples"
        runner.run(test, clear_globs=False)
        globs = test.globs  # a DocTest runs in a copy: the next block continues from this one
    failed, _ = runner.summarize(verbose=False)
    assert failed == 0


@pytest.mark.parametrize("block", all_blocks("python"), ids=lambda b: b.where)
def test_python_blocks_compile(block: Block) -> None:
    compile(block.body, block.where, "exec")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(page: Path) -> list[str]:
    text = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", page.read_text(), flags=re.M | re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize(
    "page", [*PAGES, ROOT / "tests/README.md", ROOT / "bench/README.md"], ids=lambda p: str(p.relative_to(ROOT))
)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            broken.append(target)
    assert broken == []


def test_the_readme_links_every_page_and_the_other_readmes() -> None:
    linked = {str((ROOT / t.partition("#")[0]).resolve().relative_to(ROOT)) for t in links(README) if ":" not in t}
    pages = {str(p.relative_to(ROOT)) for p in PAGES[1:]} | {"tests/README.md", "bench/README.md"}
    assert sorted(pages - linked) == []


def test_the_readme_is_short_and_keeps_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    # .ci/run runs the first line matching its own pattern: the README's test command.
    pattern = re.search(r"grep -m1 -E '([^']+)' README\.md", (ROOT / ".ci/run").read_text())
    assert pattern is not None
    ci_lines = [line for line in text.splitlines() if re.search(pattern[1].replace(r"\s", r"[ \t]"), line)]
    assert ci_lines[:1] == ["./scripts/setup.sh && .venv/bin/python -m pytest"]
    assert "./scripts/setup.sh && .venv/bin/pycni demo" in text.splitlines()
