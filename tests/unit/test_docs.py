"""The README and ``docs/`` say what the repository is: every path and module they name exists, every
``billing`` command and flag they show is one the CLI has, the README stays short with the quick start the
team and CI rely on (``make demo``, ``make test``), and no file speaks of how the project was made
(history lives in CHANGELOG.md). ``tests/system/test_quickstart.py`` runs the demo itself."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from billing.cli import cli
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
#: What the README and docs describe; CHANGELOG.md is history and may name what no longer exists.
DESCRIBING = [README, *DOCS]
REQUIRED_DOCS = ("architecture", "billing-rules", "configuration", "operations", "deploy", "performance")

#: A repository path: one of its top-level folders, then a name (placeholders like ``<role>`` end it).
_PATH = re.compile(
    r"(?<![\w./-])((?:shared|initiator|processor|controller|store|billing|benchmarks|tests|deploy|docs)/[\w./-]*)"
)
_LINK = re.compile(r"\]\(([\w./-]+)(?:#[^)]*)?\)")
_MODULE = re.compile(r"python -m ([\w.]+)")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
_SPAN = re.compile(r"`([^`\n]+)`")
_COMMAND = re.compile(r"(?<![\w.-])billing\s+([a-z][\w-]*(?:\s*\|\s*[a-z][\w-]*)*)((?:\s+[a-z][\w|-]*)?)")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
_DIARY = re.compile(r"\b(stop [0-9]+|this[ ]stop|issue [0-9]+)\b", re.I)


def _code(text: str) -> Iterator[str]:
    """Every line of every fenced block, and every inline code span outside them."""
    for block in _FENCE.findall(text):
        yield from block.splitlines()
    yield from _SPAN.findall(_FENCE.sub("", text))


def _repository_files() -> list[Path]:
    """Tracked files and untracked ones git does not ignore (what a commit of the tree would hold)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def _text_files() -> Iterator[tuple[Path, str]]:
    for path in _repository_files():
        if "node_modules" in path.parts or path.name in ("package-lock.json", "CHANGELOG.md"):
            continue
        try:
            yield path, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue


def _options(command: click.Command) -> set[str]:
    return {name for param in command.params if isinstance(param, click.Option) for name in param.opts}


def _commands(line: str) -> Iterator[tuple[str, click.Command | None, list[str]]]:
    """(how it was written, the command or None, the flags written after it) for each ``billing …`` in ``line``;
    alternatives (``up | down``, ``show|replay|purge``) each yield their own."""
    for segment in re.split(r"\s&&?\s|&$|\s#\s", line):
        starts = list(_COMMAND.finditer(segment))
        for number, match in enumerate(starts):
            end = starts[number + 1].start() if number + 1 < len(starts) else len(segment)
            flags = _FLAG.findall(segment[match.end() : end])
            for name in re.split(r"\s*\|\s*", match.group(1)):
                command = cli.commands.get(name)
                subcommands = match.group(2).split()
                if isinstance(command, click.Group) and subcommands:
                    for sub in subcommands[0].split("|"):
                        yield f"billing {name} {sub}", command.commands.get(sub), flags
                else:
                    yield f"billing {name}", command, flags


def test_the_readme_is_short_and_the_docs_exist() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move detail to docs/"
    assert {path.stem for path in DOCS} >= set(REQUIRED_DOCS)
    assert (ROOT / "CHANGELOG.md").is_file()


def test_the_quick_start_is_make_demo_and_make_test() -> None:
    readme = README.read_text(encoding="utf-8")
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [line.split("#")[0].strip() for line in _FENCE.findall(quick_start)[0].splitlines()]
    assert [c for c in commands if c] == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = dict(re.findall(r"^([\w-]+):[^\n]*\n((?:\t[^\n]*\n)*)", makefile, re.M))
    assert "-m billing demo" in targets["demo"] and "-m pytest" in targets["test"]


@pytest.mark.parametrize("doc", DESCRIBING, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_named_exists(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    named = {p.rstrip(".,;:") for p in _PATH.findall(text)}
    missing = sorted(p for p in named if not (ROOT / p).exists())
    links = {link for link in _LINK.findall(text) if "://" not in link}
    missing += sorted(link for link in links if not (doc.parent / link).exists())
    assert not missing, f"{doc.name} names what the repository does not have: {missing}"


@pytest.mark.parametrize("doc", DESCRIBING, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_module_run_exists(doc: Path) -> None:
    modules = set(_MODULE.findall(doc.read_text(encoding="utf-8")))
    missing = sorted(m for m in modules if importlib.util.find_spec(m) is None)
    assert not missing, f"{doc.name} runs modules that do not exist: {missing}"


@pytest.mark.parametrize("doc", DESCRIBING, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_billing_command_and_flag_shown_exists(doc: Path) -> None:
    wrong = []
    for line in _code(doc.read_text(encoding="utf-8")):
        for written, command, flags in _commands(line):
            if command is None:
                wrong.append(f"{written}: no such command")
            elif unknown := [f for f in flags if f not in _options(command) | {"--help"}]:
                wrong.append(f"{written}: no option {', '.join(unknown)} (in: {line.strip()})")
    assert not wrong, f"{doc.name}:\n" + "\n".join(wrong)


def test_the_command_checker_sees_what_is_wrong() -> None:
    found = {(w, c is not None, tuple(f)) for w, c, f in _commands("billing poison show|replay [--all] --nope")}
    assert found == {
        ("billing poison show", True, ("--all", "--nope")),
        ("billing poison replay", True, ("--all", "--nope")),
    }
    assert [c for _, c, _ in _commands("billing initiator & billing nosuch &")][1] is None


def test_every_setting_is_documented() -> None:
    documented = set(re.findall(r"`(BILLING_[A-Z0-9_]+)`", (ROOT / "docs" / "configuration.md").read_text("utf-8")))
    missing = sorted({f"BILLING_{name.upper()}" for name in Settings.model_fields} - documented)
    assert not missing, f"docs/configuration.md lacks {missing}"


def test_no_file_cites_the_outside_spec_and_the_rules_are_here() -> None:
    assert (ROOT / "docs" / "billing-rules.md").is_file()
    citing = sorted(str(p.relative_to(ROOT)) for p, text in _text_files() if "BILLING_" + "SPEC" in text)
    assert not citing, f"cite docs/billing-rules.md instead: {citing}"


def test_no_file_tells_how_the_project_was_made() -> None:
    diary = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
        for path, text in _text_files()
        for number, line in enumerate(text.splitlines(), 1)
        if (match := _DIARY.search(line))
    ]
    assert not diary, "history belongs in CHANGELOG.md:\n" + "\n".join(diary)
