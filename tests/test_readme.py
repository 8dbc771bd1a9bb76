"""The README as a newcomer meets it: short, its links lead somewhere, and its commands run.

The fenced `bash` blocks of "Quick start" and "Forecast new data" are run line by line from an empty
folder, with TINY settings appended to every train.py line; `make` lines and `mlflow ui` (a server)
are skipped, and `<run id>` is the id the last train.py line printed (a train.py line the README
repeats is the same run: it runs once).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, TINY

README = REPO / "README.md"
RUN_SECTIONS = ("## Quick start", "## Forecast new data")
PAGES = [README, *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "benchmarks").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def section(text: str, heading: str) -> str:
    """The body of the `## ` section whose heading starts with `heading`."""
    (body,) = [part for part in text.split("\n## ") if ("## " + part).startswith(heading)]
    return body


def fenced(body: str, lang: str) -> list[str]:
    """The contents of the ```lang blocks in `body` (lang "" for blocks without a language)."""
    blocks, current, opened = [], None, None
    for line in body.splitlines():
        if not line.startswith("```"):
            if current is not None:
                current.append(line)
        elif current is None:
            current, opened = [], line[3:].strip()
        else:
            if opened == lang:
                blocks.append("\n".join(current) + "\n")
            current = None
    return blocks


def commands() -> list[str]:
    """The command lines of the run sections' bash blocks, comments stripped, continuations joined."""
    text = README.read_text()
    lines = []
    for heading in RUN_SECTIONS:
        for block in fenced(section(text, heading), "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line.replace("<run id>", "'<run id>'"), comments=True)
                if words:
                    lines.append(shlex.join(words))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.MULTILINE)}


def test_readme_is_at_most_300_lines():
    assert len(README.read_text().splitlines()) <= 300


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_lead_to_files_and_headings_that_exist(page):
    assert page.exists()
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
            broken.append(target)
    assert not broken, broken


def test_run_sections_hold_the_commands_the_end_to_end_test_runs():
    lines = commands()
    assert sum("train.py" in line for line in lines) >= 2
    assert any(line.startswith(".venv/bin/tsformer-data simulate") for line in lines)
    assert any("predict.py '<run id>'" in line for line in lines)
    assert all(line.startswith((".venv/bin/", "make ")) for line in lines), lines


def shown_as(line: str) -> str:
    """A summary line with paths, run ids and numbers replaced, for comparing its form."""
    line = re.sub(r"[0-9a-f]{32}", "RUNID", line)
    line = " ".join("PATH" if "/" in w or w.endswith(".py") else w for w in line.split())
    return re.sub(r"-?\d+(\.\d+)?", "N", line)


@pytest.mark.slow
def test_readme_commands_run_as_written(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    bin_dir = Path(sys.executable).parent
    run_id = None
    ran = []
    trained = {}  # train.py line -> its run id: a line the README repeats (the same run) runs once
    for line in commands():
        words = shlex.split(line)
        if words[0] == "make" or Path(words[0]).name == "mlflow":  # a server: skipped
            continue
        if line in trained:
            run_id = trained[line]
            continue
        # .venv/bin/<tool> of the checkout: the interpreter and tools this test runs with
        words[0] = sys.executable if words[0] == ".venv/bin/python" else str(bin_dir / Path(words[0]).name)
        words = [str(REPO / w) if w in ("train.py", "predict.py") else w for w in words]
        if words[1:2] == [str(REPO / "train.py")]:
            words += TINY
        if "<run id>" in words:
            assert run_id, "a predict line before any train.py line"
            words[words.index("<run id>")] = run_id
        proc = subprocess.run(words, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, (line, proc.stderr[-3000:])
        ran.append(line)
        if words[1:2] == [str(REPO / "train.py")]:
            (run_id,) = set(re.findall(r"MLflow run id: ([0-9a-f]{32})", proc.stdout))  # log and summary
            trained[line] = run_id
            if len(words) == 2 + len(TINY):  # the default run: its summary has the README's form
                sample = fenced(section(README.read_text(), "## Quick start"), "")[0]
                printed = {shown_as(x) for x in proc.stdout.splitlines()}
                missing = [x for x in sample.splitlines() if shown_as(x) not in printed]
                assert not missing, (missing, proc.stdout)
    assert any("predict.py" in line for line in ran) and (tmp_path / "forecasts.csv").exists()


def test_every_command_runs_with_the_environments_programs():
    """One way to run things, said once in "Install": `.venv/bin/python`, `.venv/bin/tsformer-*`; a bare
    `python` fails with "No module named 'tsformer'" unless the environment is activated."""
    text = README.read_text()
    lines = []
    for block in fenced(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.replace("<run id>", "'<run id>'"), comments=True)
            while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value before the program
                words = words[1:]
            if words:
                lines.append(words[0])
    assert lines and not [w for w in lines if not (w.startswith(".venv/bin/") or w == "make")]
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```$", "", text, flags=re.MULTILINE | re.DOTALL))
    bare = [code for code in inline if re.match(r"(python|tsformer-(data|serve|predict))\b", code)]
    assert not bare, bare


def table_options(text: str) -> dict[str, set[str]]:
    """{config group: the options the Configuration table's row lists} (a row may name several groups)."""
    rows = {}
    for line in section(text, "## Configuration").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`") and cells[0].endswith("/`"):
            options = set(re.findall(r"`(\w+)`", cells[1]))
            for group in re.findall(r"`(\w+)/`", cells[0]):
                rows[group] = options
    return rows


def test_configuration_table_lists_every_option_of_conf():
    """The table is checked against conf/: each group folder, each of its options (files `_*.yaml` are
    shared parts, not options), and no option that does not exist."""
    conf = REPO / "conf"
    expected = {
        group.name: {p.stem for p in group.glob("*.yaml") if not p.stem.startswith("_")}
        for group in sorted(conf.iterdir())
        if group.is_dir()
    }
    listed = table_options(README.read_text())
    assert set(listed) == set(expected), ("groups", set(expected) ^ set(listed))
    drift = {
        group: {"missing": sorted(options - listed[group]), "not in conf/": sorted(listed[group] - options)}
        for group, options in expected.items()
        if options != listed[group]
    }
    assert not drift, drift
