"""No import circle between the modules of src/tsformer: a lower layer never imports a higher one.

Every `import` and `from ... import` counts, at module level or inside a function (a deferred import
still ties the two modules together: it only moves the failure from import time to call time). An
import of a package counts as one of its `__init__.py`; a name imported from a package counts as its
module when the name is a module of the package.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def module_files(src: Path = SRC) -> dict[str, Path]:
    """Dotted module name -> its file, for every module and package of the tree under `src`."""
    files = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    """The modules of `modules` that the module `name` (its file `path`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, `level - 1` packages up
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in modules else base)
    return {m for m in found if m in modules and m != name}


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    files = module_files(src)
    return {name: imported_modules(name, path, set(files)) for name, path in files.items()}


def test_no_module_of_src_is_part_of_an_import_circle():
    try:
        graphlib.TopologicalSorter(import_graph()).prepare()
    except graphlib.CycleError as err:
        pytest.fail("import circle: " + " -> ".join(err.args[1]))


def test_a_circle_is_found_through_a_deferred_import(tmp_path):
    """The check can fail: two modules that import each other, one of them inside a function."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def f():\n    from pkg.high import g\n")
    (package / "high.py").write_text("from . import low\n\ndef g():\n    pass\n")
    graph = import_graph(tmp_path)
    assert graph["pkg.low"] == {"pkg.high"} and graph["pkg.high"] == {"pkg.low"}
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter(graph).prepare()
