"""The layers of docs/architecture.md hold, read from the source (ast over src/tsformer, no import):
generic code imports no job's package (only the registry, `tsformer.jobs` and `tsformer.jobs.base`); the
layers below the jobs (tasks, models, nn, data, the model folder) import no job and nothing that puts a
model to use; nn and models import no layer above them; and no module outside a job's package uses a
private name of it (an import `from ... import _name`, or `something._name` for a name the package
defines)."""

from __future__ import annotations

import ast
import functools
import graphlib
from pathlib import Path

import pytest

from conftest import REPO

SRC = REPO / "src"
PACKAGE = SRC / "tsformer"
REGISTRY = ("tsformer.jobs", "tsformer.jobs.base")
# what puts a model to use or runs it: none of the layers below the jobs imports these
ABOVE = ("tsformer.jobs", "tsformer.serving", "tsformer.train", "tsformer.predict", "tsformer.callbacks",
         "tsformer.init_from", "tsformer.sweep", "tsformer.resume")  # fmt: skip
BELOW = ("tsformer.tasks", "tsformer.models", "tsformer.nn", "tsformer.data", "tsformer.model_folder")
# module -> the layers it never imports, beyond ABOVE
NARROWER = {"tsformer.nn": ("tsformer.models", "tsformer.tasks", "tsformer.data"),
            "tsformer.models": ("tsformer.tasks", "tsformer.data")}  # fmt: skip
# the imports allowed against those rules, each with its reason
ALLOWED = {
    # the ensemble command trains its members as ordinary runs: an entry point inside its job's package
    ("tsformer.jobs.classification.ensemble", "tsformer.train"),
    # a small leaf: atomic writes, shared by the model folder and the jobs' outputs
    ("tsformer.model_folder", "tsformer.serving.writers"),
}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")


def imports(tree: ast.AST) -> list[tuple[str, str | None, int]]:
    """(module, name or None, line) of every import of a tsformer module (`from tsformer import x` is
    the module tsformer.x)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tsformer":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / Path(*sub.split("."))).with_suffix(".py").is_file() or (
                    PACKAGE.parent / Path(*sub.split("."))
                ).is_dir()
                found.append(
                    (sub, None, node.lineno) if is_module else (node.module, alias.name, node.lineno)
                )
        elif isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == "tsformer"]
    return found


def job_package(module: str) -> str | None:
    """`tsformer.jobs.<job>` of a module inside a job's package, else None."""
    parts = module.split(".")
    return ".".join(parts[:3]) if len(parts) > 3 and parts[1] == "jobs" and parts[2] != "base" else None


def within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


MODULES = {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache  # read once: every module's test asks
def private_names_of_jobs() -> dict[str, str]:
    """Private name -> the job package that defines it (functions, classes, methods, module names)."""
    defined = {}
    for module, tree in MODULES.items():
        package = job_package(module)
        if package is None:
            continue
        for node in ast.walk(tree):
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            defined |= {n: package for n in names if n.startswith("_") and not n.startswith("__")}
    return defined


def test_the_import_walk_finds_the_modules_and_their_imports():
    """The rules below can fail: the walk sees the registry's imports and a job's own."""
    assert {"tsformer.train", "tsformer.jobs.forecasting.forecaster", "tsformer.nn.attention"} <= set(MODULES)
    assert ("tsformer.jobs", "prediction_params") in {
        (m, n) for m, n, _ in imports(MODULES["tsformer.predict"])
    }
    found = imports(MODULES["tsformer.jobs.imputation.job"])
    assert any(m == "tsformer.jobs.forecasting.forecaster" for m, _, _ in found)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_what_its_layer_may(module):
    bad = []
    package = job_package(module)
    for target, name, line in imports(MODULES[module]):
        if (module, target) in ALLOWED or (module.startswith(target + ".") and target != "tsformer"):
            continue
        other_job = job_package(target)
        if package is None and other_job is not None:
            bad.append(f"line {line}: {target} (a job's package; generic code imports the registry only)")
        if within(module, BELOW) and within(target, ABOVE):
            bad.append(f"line {line}: {target} (a layer above {module.split('.')[1]})")
        for layer, never in NARROWER.items():
            if within(module, [layer]) and within(target, never):
                bad.append(f"line {line}: {target} (above {layer})")
        if package is not None and within(
            target, ("tsformer.train", "tsformer.predict", "tsformer.serving.server")
        ):
            bad.append(f"line {line}: {target} (jobs never import the entry points)")
        if name and name.startswith("_") and not name.startswith("__") and other_job and other_job != package:
            bad.append(f"line {line}: {target}.{name} (a private name of {other_job})")
    assert not bad, f"{module}: " + "; ".join(bad)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_uses_a_private_name_of_another_jobs_package(module):
    private = private_names_of_jobs()
    package = job_package(module)
    bad = []
    for node in ast.walk(MODULES[module]):
        if isinstance(node, ast.Attribute) and node.attr in private and private[node.attr] != package:
            owner = node.value.id if isinstance(node.value, ast.Name) else ""
            if owner not in ("self", "cls"):
                bad.append(f"line {node.lineno}: {ast.unparse(node)} ({private[node.attr]}'s)")
    assert not bad, f"{module}: " + "; ".join(bad)


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of src/tsformer it imports, at module level or inside a function (a deferred
    import ties two modules together as much as any: it only moves the failure from import time to
    the call)."""
    return {
        module: {target for target, _, _ in imports(tree) if target in MODULES and target != module}
        for module, tree in MODULES.items()
    }


def import_circle(graph: dict[str, set[str]]) -> list[str]:
    """A circle of imports in `graph` (its modules in order, the first again at the end), or []."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        return list(reversed(err.args[1]))
    return []


def test_no_module_of_src_is_part_of_an_import_circle():
    circle = import_circle(import_graph())
    assert not circle, "import circle (a lower layer imports a higher one): " + " -> ".join(circle)


def test_a_deferred_import_that_closes_a_circle_is_found():
    """The check can fail: an import inside a function counts, and one back up the layers is a circle."""
    deferred = ast.parse("def build():\n    from tsformer.models.encoder_only import EncoderOnly\n")
    assert [m for m, _, _ in imports(deferred)] == ["tsformer.models.encoder_only"]
    graph = import_graph()
    assert "tsformer.nn.embedding" in graph["tsformer.models.encoder_only"]
    graph["tsformer.nn.embedding"] = graph["tsformer.nn.embedding"] | {"tsformer.models.encoder_only"}
    circle = import_circle(graph)
    assert circle[0] == circle[-1] and {"tsformer.nn.embedding", "tsformer.models.encoder_only"} <= set(
        circle
    )
