"""The documentation's examples are true: README.md, docs/*.md and the summary of bench/RESULTS.md.

* every ```toml block parses, and a block that is a whole run config (``model``
  and a ``[plan]``) loads as a RunConfig, its ``[launch]`` table as a LaunchSpec,
  as ``workbench launch`` reads them;
* every ```python block compiles, and its ``workbench`` imports resolve (only
  the import statements are executed, so nothing launches or trains);
* every command line of a shell or text block that starts with ``workbench``
  (also after ``$ ``) names a real subcommand, every ``--option`` it shows is
  that subcommand's, and the whole line parses with the real parser; inline
  ```workbench ...``` code in the prose names a real subcommand and options;
  every ``make X`` names a Makefile target;
* every relative link points to an existing file, and an ``#anchor`` to a
  heading there (GitHub's slugs);
* the summary table at the top of bench/RESULTS.md links to its sections, and
  every number of a row appears in the section the row links to.

A failure names the file, the line and the block. No subprocess: the parser is
built in-process and nothing it parses is run.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import io
import re
import shlex
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULTS = ROOT / "bench" / "RESULTS.md"
LINKED = [*DOCS, RESULTS]
SHELL_LANGS = {"", "bash", "sh", "shell", "console", "text"}
SEPARATORS = {";", "&&", "||", "|", "&"}


@dataclass(frozen=True)
class Block:
    path: Path
    lang: str
    line: int  # 1-based line of the opening fence
    text: str

    def where(self, offset: int = 0) -> str:
        at = self.line + 1 + offset
        return f"{self.path.relative_to(ROOT)}:{at} (```{self.lang} block opened at line {self.line})"


def fenced_blocks(path: Path) -> list[Block]:
    blocks, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{path.relative_to(ROOT)}:{start + 1}: a ```{lang} block is never closed"
        blocks.append(Block(path, lang, start + 1, "\n".join(body)))
        i += 1
    return blocks


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(1-based line number, text) of the lines outside fenced blocks."""
    out, inside, fence = [], False, ""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
        if m and not inside:
            inside, fence = True, m.group(1)
            continue
        if inside:
            if line.strip().startswith(fence):
                inside = False
            continue
        out.append((n, line))
    return out


def all_blocks(lang: set[str] | str) -> list[Block]:
    langs = {lang} if isinstance(lang, str) else lang
    return [b for path in DOCS for b in fenced_blocks(path) if b.lang in langs]


def block_id(block: Block) -> str:
    return f"{block.path.relative_to(ROOT)}:{block.line}"


# -- TOML -----------------------------------------------------------------------------------------------------------------

TOML_BLOCKS = all_blocks("toml")


def test_the_docs_have_examples_of_each_kind():
    assert TOML_BLOCKS and all_blocks("python") and all_blocks({"bash", "console"})


@pytest.mark.parametrize("block", TOML_BLOCKS, ids=block_id)
def test_toml_blocks_parse_and_run_configs_load(block):
    try:
        data = tomllib.loads(block.text)
    except tomllib.TOMLDecodeError as exc:
        pytest.fail(f"{block.where()}: not valid TOML: {exc}")
    if "model" not in data or "plan" not in data:
        return
    from workbench.core.config import RunConfig
    from workbench.jobs import LaunchSpec

    launch = dict(data.pop("launch", {}))
    try:
        config = RunConfig.from_dict(data)
        if launch:
            LaunchSpec(config=config, **launch)
    except (ValueError, TypeError) as exc:
        pytest.fail(f"{block.where()}: a run config that does not load: {exc}")


# -- Python ---------------------------------------------------------------------------------------------------------------

PYTHON_BLOCKS = all_blocks("python")


def _resolve(module: str, names: list[str], where: str) -> None:
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"{where}: `import {module}` fails: {exc}")
    for name in names:
        if name == "*" or hasattr(mod, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            pytest.fail(f"{where}: `from {module} import {name}`: {module} has no {name!r}")


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=block_id)
def test_python_blocks_compile_and_their_imports_resolve(block):
    name = block.where()
    try:
        tree = ast.parse(block.text, name)
        compile(tree, name, "exec")
    except SyntaxError as exc:
        pytest.fail(f"{block.where((exc.lineno or 1) - 1)}: does not compile: {exc.msg}")
    for node in ast.walk(tree):
        where = block.where(node.lineno - 1) if hasattr(node, "lineno") else name
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "workbench":
                    _resolve(alias.name, [], where)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "workbench":
            _resolve(node.module, [a.name for a in node.names], where)


# -- command lines --------------------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def cli_parser() -> argparse.ArgumentParser:
    from workbench.cli import build_parser

    return build_parser()


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in cli_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@lru_cache(maxsize=1)
def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_-][A-Za-z0-9_.-]*)\s*:(?!=)", text, re.M)}


def logical_lines(block: Block) -> list[tuple[int, str]]:
    """(offset of the first physical line, text) with backslash continuations joined and a `$ ` prompt
    removed; in a block whose commands carry prompts, only the prompted lines (the rest is output)."""
    raw = block.text.splitlines()
    prompted = any(line.lstrip().startswith("$ ") for line in raw)
    out, i = [], 0
    while i < len(raw):
        start, line = i, raw[i]
        while line.rstrip().endswith("\\") and i + 1 < len(raw):
            i += 1
            line = line.rstrip()[:-1] + " " + raw[i].strip()
        i += 1
        stripped = line.strip()
        if stripped.startswith("$ "):
            stripped = stripped[2:]
        elif prompted:
            continue
        out.append((start, stripped))
    return out


def commands_in(text: str) -> list[list[str]]:
    """The simple commands of one shell line (env assignments in front dropped), comments removed."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands, current = [], []
    for token in lexer:
        if token in SEPARATORS:
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    out = []
    for words in commands:
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words = words[1:]
        if words:
            out.append(words)
    return out


def check_workbench_words(words: list[str], where: str, *, parse: bool) -> None:
    parsers = subparsers()
    if len(words) == 2 and words[1] in cli_parser()._option_string_actions:  # `workbench --help`
        return
    if len(words) < 2 or words[1] not in parsers:
        pytest.fail(f"{where}: `{' '.join(words)}`: {words[1] if len(words) > 1 else '(none)'!r} is not a "
                    f"workbench subcommand; they are {sorted(parsers)}")
    sub = parsers[words[1]]
    for word in words[2:]:
        if word.startswith("-") and not re.fullmatch(r"-\d[\d.]*", word):
            option = word.split("=", 1)[0]
            if option not in sub._option_string_actions:
                known = sorted(o for o in sub._option_string_actions if o.startswith("--"))
                pytest.fail(f"{where}: `workbench {words[1]}` has no option {option}; its options are {known}")
    if not parse:
        return
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            cli_parser().parse_args(words[1:])
    except SystemExit as exc:
        if exc.code:
            pytest.fail(f"{where}: `{' '.join(words)}` does not parse: {stderr.getvalue().strip()}")


def check_make_words(words: list[str], where: str) -> None:
    targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    for target in targets:
        if target not in make_targets():
            pytest.fail(f"{where}: `make {target}`: the Makefile has no target {target!r}; "
                        f"its targets are {sorted(make_targets())}")


COMMAND_BLOCKS = all_blocks(SHELL_LANGS)


@pytest.mark.parametrize("block", COMMAND_BLOCKS, ids=block_id)
def test_command_lines_name_real_subcommands_options_and_targets(block):
    for offset, line in logical_lines(block):
        if not re.search(r"(^|[;&|]\s*|^\S+=\S*\s+)(workbench|make)(\s|$)", line):
            continue
        where = block.where(offset)
        try:
            commands = commands_in(line)
        except ValueError as exc:
            pytest.fail(f"{where}: cannot split `{line}` into shell words: {exc}")
        for words in commands:
            if words[0] == "workbench":
                check_workbench_words(words, where, parse=True)
            elif words[0] == "make":
                check_make_words(words, where)


INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_inline_commands_name_real_subcommands_options_and_targets(path):
    for number, line in prose_lines(path):
        for code in INLINE.findall(line):
            where = f"{path.relative_to(ROOT)}:{number}"
            if code.startswith("workbench "):
                words = code.split()
                if not re.fullmatch(r"-[-\w]+|[a-z][a-z-]*", words[1]):  # `workbench SUBCOMMAND`, `workbench X: ...`
                    continue
                check_workbench_words(words, where, parse=False)
            elif code.startswith("make "):
                try:
                    check_make_words(shlex.split(code), where)
                except ValueError as exc:
                    pytest.fail(f"{where}: cannot split `{code}` into shell words: {exc}")


# -- links ----------------------------------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to
    hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return frozenset(out)


def links(path: Path) -> list[tuple[int, str]]:
    out = []
    for number, line in prose_lines(path):
        text = INLINE.sub("", line)
        out += [(number, m.group(1)) for m in LINK.finditer(text)]
    return out


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files_and_headings(path):
    for number, target in links(path):
        where = f"{path.relative_to(ROOT)}:{number}"
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            pytest.fail(f"{where}: the link ({target}) points to {file_part}, which does not exist")
        if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            pytest.fail(f"{where}: the link ({target}) names the heading #{anchor}, which "
                        f"{resolved.relative_to(ROOT)} does not have")


# -- bench/RESULTS.md's summary -------------------------------------------------------------------------------------------

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def summary_rows() -> list[tuple[int, list[str]]]:
    """The rows of the first table of RESULTS.md, before its first section."""
    rows = []
    for number, line in prose_lines(RESULTS):
        if line.startswith("## "):
            break
        if line.startswith("|") and not re.match(r"^\|[\s:|-]+\|$", line):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            rows.append((number, cells))
    return rows[1:]  # the header


def sections() -> dict[str, str]:
    """RESULTS.md's ``##`` sections by anchor: the heading and the text under it."""
    out: dict[str, list[str]] = {}
    current = None
    for line in RESULTS.read_text().splitlines():
        if line.startswith("## "):
            current = slug(line[3:])
            out[current] = [line]
        elif current is not None:
            out[current].append(line)
    return {anchor: "\n".join(lines) for anchor, lines in out.items()}


def test_results_summary_covers_every_section():
    rows = summary_rows()
    assert rows, "bench/RESULTS.md opens with no summary table"
    linked = set()
    for number, cells in rows:
        found = [m.group(1) for cell in cells for m in LINK.finditer(cell)]
        assert found, f"bench/RESULTS.md:{number}: a summary row without a link to its section"
        linked.update(target.lstrip("#") for target in found)
    missing = set(sections()) - linked
    assert not missing, f"bench/RESULTS.md: sections without a row in the summary: {sorted(missing)}"


def test_results_summary_numbers_are_copied_from_their_sections():
    bodies = sections()
    for number, cells in summary_rows():
        target = next(m.group(1) for cell in cells for m in LINK.finditer(cell)).lstrip("#")
        assert target in bodies, f"bench/RESULTS.md:{number}: the row links to #{target}, which is no section"
        for cell in cells:
            for figure in NUMBER.findall(LINK.sub("", cell)):
                assert figure in bodies[target], (
                    f"bench/RESULTS.md:{number}: {figure!r} in the summary does not appear in the section "
                    f"#{target}")
