"""What varies by job belongs to the job, read from the source (ast, no import of the checked code):
serving/'s code names no registered job and no column a job declares (`Prediction.per_series_ids`),
so a new job needs no change there; and no benchmark uses a private member of src/tsformer (a
`something._name` or `from tsformer... import _name` of a name src/tsformer defines), so that the
public API gives what a benchmark needs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import REPO
from tsformer.jobs import JOBS

PACKAGE = REPO / "src" / "tsformer"
SERVING = sorted((PACKAGE / "serving").glob("*.py"))
BENCHMARKS = sorted((REPO / "benchmarks").glob("*.py"))


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions (usage examples may stay)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def words_of_code(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, text) of every string constant (docstrings excluded) and every name the code gives or
    uses: variables, attributes, functions, classes, arguments, keywords, imports."""
    skip = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            found.append((node.lineno, node.attr))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append((node.lineno, node.name))
        elif isinstance(node, ast.arg):
            found.append((node.lineno, node.arg))
        elif isinstance(node, ast.keyword) and node.arg:
            found.append((node.value.lineno, node.arg))
        elif isinstance(node, ast.alias):
            found.append((node.lineno, node.asname or node.name))
    return found


def job_words() -> dict[str, re.Pattern]:
    """What names a job: each registered job's name and each column a job declares, as a word of a
    text or of an identifier (`anomaly_rows`, `PER_EVENT_ID`)."""
    names = set(JOBS) | {col for job in JOBS.values() for col in job.prediction.per_series_ids}
    return {name: re.compile(rf"(?<![a-z0-9]){re.escape(name)}(?![a-z0-9])") for name in names}


def job_specific_at(path: Path, root: Path) -> list[str]:
    """'<file>:<line>: <text> names <job or column>' of each word of `path`'s code naming a job."""
    words = job_words()
    found = {
        (line, text, name)
        for line, text in words_of_code(parsed(path))
        for name, pattern in words.items()
        if pattern.search(text.lower())
    }
    return [f"{path.relative_to(root)}:{line}: {text!r} names {name!r}" for line, text, name in sorted(found)]


def test_the_check_finds_a_job_name_and_a_declared_column_in_code_but_not_in_docstrings(tmp_path):
    column = next(col for job in JOBS.values() for col in job.prediction.per_series_ids)
    job = next(iter(JOBS))
    module = tmp_path / "module.py"
    module.write_text(
        f'"""Usage: {job} models, their {column}."""\n\n'
        f'IDS = ("{column}",)\n\n\n'
        f"def f({job}_model):\n"
        f'    """The {job} model."""\n'
        f'    return f"a {job} model"\n'
    )
    found = [line.split(": ", 1)[0] for line in job_specific_at(module, tmp_path)]
    assert found == ["module.py:3", "module.py:6", "module.py:8"]


@pytest.mark.parametrize("path", SERVING, ids=lambda p: p.name)
def test_serving_code_names_no_job_and_no_job_declared_column(path):
    found = job_specific_at(path, REPO)
    assert not found, "what varies by job belongs to the job (jobs.base.Prediction):\n" + "\n".join(found)


# -- benchmarks use the public API ----------------------------------------------------------------------


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_names_of_src() -> set[str]:
    """Every private name src/tsformer defines: functions, classes, methods, module-level and class-level
    names, attributes set on `self`, and modules (`_x.py`)."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        names.add(path.stem)
        for node in ast.walk(parsed(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return {name for name in names if is_private(name)}


def private_uses(path: Path, ours: set[str], root: Path) -> list[str]:
    """`x._name` and `from tsformer... import _name` in `path`, of a private name src/tsformer defines
    (another library's private names are not ours to judge: pandas' `df._x`)."""
    found = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Attribute) and node.attr in ours:
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tsformer":
            found += [(node.lineno, f"import {a.name}") for a in node.names if is_private(a.name)]
    return [f"{path.relative_to(root)}:{line}: {what}" for line, what in sorted(found)]


def test_the_private_use_check_finds_a_private_method_and_a_private_import(tmp_path):
    bench = tmp_path / "bench.py"
    bench.write_text(
        "from tsformer.jobs.classification.classifier import Classifier, _uncalibrated\n"
        "import pandas as pd\n\n"
        "windows = Classifier.load('m')._stream_windows(pd.DataFrame(), 'x', None)\n"
        "private_to_pandas = pd.DataFrame()._mgr\n"
    )
    ours = private_names_of_src() | {"_stream_windows"}  # the method named, whether src still has it
    assert private_uses(bench, ours, tmp_path) == [
        "bench.py:1: import _uncalibrated",
        "bench.py:4: ._stream_windows",
    ]


def test_no_benchmark_uses_a_private_member_of_src():
    ours = private_names_of_src()
    found = [line for path in BENCHMARKS for line in private_uses(path, ours, REPO)]
    assert not found, "benchmarks use src/tsformer's public API:\n" + "\n".join(found)
