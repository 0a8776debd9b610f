"""The layout of src/attnlab and tasks, read from the source with `ast` (nothing is imported):

- no import cycle among their modules;
- no module imports from a layer above its own (LAYERS, bottom first; a module may import its own
  layer and those below);
- the library never imports the tasks, and a task imports of the study package only its leaves:
  both load task code by name (Hydra's `_target_`, a card's claim module), so an import back
  would be a cycle through a string, invisible to the graph; neither imports bench/;
- no code file is over 400 lines.

Imports inside functions count: a lazy import that breaks a cycle at run time is still a cycle,
and still a dependency, in the design. Imports under `if TYPE_CHECKING:` do not: they are
annotations only and never run. Importing a.b.c runs the __init__ of a and a.b first, so that
is an import of those packages too (`attnlab.attention`'s __init__ imports the whole package).
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.paths import ROOT

SRC = ROOT / "src"
PACKAGE = SRC / "attnlab"
TASKS = ROOT / "tasks"
MAX_LINES = 400
CODE = (".py", ".cpp", ".h", ".cu")

# the modules of attnlab.study a task may import: the shared leaves, never the drivers (which
# import a task's claim module by name from its card: a task importing them back would be a cycle
# through a string, invisible to the graph)
STUDY_LEAVES = {"attnlab.study.evidence", "attnlab.study.stats", "attnlab.study.power",
                "attnlab.study.learned"}

# The layers, bottom first. `x.*` is x and every module under it; a module belongs to its most
# specific pattern (a name before `x.*`, a longer prefix before a shorter one). A new module
# that no pattern names fails test_every_module_has_a_layer: place it here.
LAYERS: list[tuple[str, list[str]]] = [
    # what every part may use: errors, files, the console, plots, the logger interface, the
    # task cards, checkpoints on disk; the study package's leaves (a run's record, the statistics),
    # which the runner and the tasks' claims import too. The study package's __init__ sits here so
    # that importing a leaf stays cheap.
    ("foundation", ["attnlab", "attnlab.errors", "attnlab.files", "attnlab.console",
                    "attnlab.figures", "attnlab.loggers", "attnlab.logger_guard",
                    "attnlab.sampling", "attnlab.config_args", "attnlab.cards",
                    "attnlab.checkpoints", "attnlab.trust", "attnlab.study", *sorted(STUDY_LEAVES)]),
    # attention, bottom up. Kernels: tensors in, tensors out
    ("attention: kernels", ["attnlab.attention.kernels.*"]),
    # what the schemes run on: which kernel serves a call (paths, the CUDA table), the
    # materialized reference, the slow-path notices, recorded weights and their statistics.
    # Never the schemes.
    ("attention: mechanism", ["attnlab.attention.paths", "attnlab.attention.cuda_table",
                              "attnlab.attention.notices", "attnlab.attention.reference",
                              "attnlab.attention.positions",
                              "attnlab.attention.record", "attnlab.attention.statistics"]),
    # one file per scheme (and their base and registry): they run kernels, directly or through
    # paths; the output gate (`model.gate`), a module of the same kind as the schemes
    ("attention: schemes", ["attnlab.attention.schemes.*", "attnlab.attention.gate"]),
    # a scheme from the `model` config; the functional form
    ("attention: spec", ["attnlab.attention.spec", "attnlab.attention.functional"]),
    # the modules built on them, and the package (its __init__ imports all of it)
    ("attention: modules", ["attnlab.attention", "attnlab.attention.mha",
                            "attnlab.attention.layers", "attnlab.attention.stack",
                            "attnlab.attention.kv_cache", "attnlab.attention.recording"]),
    # built on the attention modules: torch.compile, FSDP, the transformers adapter; config
    # validation (its rules are imported by the tasks' classes); the sink and outlier numbers of
    # a model's weights and hidden states
    ("model machinery", ["attnlab.compiling", "attnlab.fsdp", "attnlab.hf.*",
                         "attnlab.config_schema", "attnlab.diagnostics", "attnlab.quantization"]),
    ("task module", ["attnlab.task_module"]),
    ("callbacks", ["attnlab.callbacks.*"]),
    # the tasks: above what they build on, below what loads them by name
    ("tasks: common", ["tasks", "tasks.common.*"]),
    ("tasks", ["tasks.*"]),
    # one run: train / evaluate (Hydra instantiates the task's classes), its record, W&B, the
    # entry point, the sweep launcher's callback
    ("run", ["attnlab.runner", "attnlab.evaluation", "attnlab.trainer", "attnlab.run_record", "attnlab.wandb_runs", "attnlab.cli",
             "attnlab.gpu_jobs"]),
    # the drivers that launch runs through train.py and judge them (they load a task's claim
    # module by name)
    ("study drivers", ["attnlab.study.*"]),
    # `python -m attnlab.<command>`
    ("commands", ["attnlab.report", "attnlab.compare", "attnlab.reproduce", "attnlab.dashboards",
                  "attnlab.docs", "attnlab.sync", "attnlab.diagnose"]),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC if path.is_relative_to(SRC) else ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    """Every module of src/attnlab and tasks: name -> file."""
    return {_module_name(p): p for root in (PACKAGE, TASKS) for p in sorted(root.rglob("*.py"))}


def _under_type_checking(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            return True
    return False


def _imported(path: Path, name: str, modules: set[str]) -> set[str]:
    """Every module that the file at `path` (module `name`) imports, as full names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if _under_type_checking(node, parents):
            continue  # annotations only: never executed
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from package import submodule` imports the submodule; `from module import name`
            # the module
            for alias in node.names:
                found.add(full if (full := f"{base}.{alias.name}") in modules else base)
    return found


def _with_packages(imported: set[str], importer: str) -> set[str]:
    """Importing a.b.c runs the __init__ of a and a.b first, except those of the importer's own
    packages (already being imported when it runs)."""
    own = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 2)}
    return imported | {package for module in imported for i in range(1, module.count(".") + 1)
                       if (package := ".".join(module.split(".")[:i])) not in own}


def _graph() -> dict[str, set[str]]:
    """module -> the modules of src/attnlab and tasks it imports."""
    files = _modules()
    graph = {}
    for name, path in files.items():
        imported = _with_packages(_imported(path, name, set(files)), name)
        if path.name == "__init__.py" and "iter_modules(__path__)" in path.read_text():
            # a package that imports every module in it (attention/schemes: the registry)
            imported |= {m for m in files if m.rpartition(".")[0] == name}
        graph[name] = {m for m in imported if m in files and m != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first = last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _layer(module: str, layers=LAYERS) -> int | None:
    """The index in `layers` of the module's most specific pattern; None if none names it."""
    matches = []  # ((prefix length, a name rather than x.*), layer index)
    for index, (_, patterns) in enumerate(layers):
        for pattern in patterns:
            prefix = pattern.removesuffix(".*")
            glob = prefix != pattern
            if module == prefix or (glob and module.startswith(prefix + ".")):
                matches.append(((len(prefix), not glob), index))
    return max(matches)[1] if matches else None


def _upward(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Every import of a module from a layer above the importer's, as 'importer (its layer) ->
    imported (its layer)'."""
    name = {i: layer for i, (layer, _) in enumerate(layers)}
    out = []
    for module, deps in sorted(graph.items()):
        own = _layer(module, layers)
        for dep in sorted(deps):
            if own is not None and (up := _layer(dep, layers)) is not None and up > own:
                out.append(f"{module} ({name[own]}) -> {dep} ({name[up]})")
    return out


def test_there_is_no_import_cycle():
    graph = _graph()
    assert "attnlab.attention.record" in graph["attnlab.attention.mha"]  # the walk sees imports
    assert "attnlab.runner" in graph["attnlab.docs"]  # ... and those inside functions
    assert "tasks.common.seq2seq" in graph["tasks.headline.network"]  # ... and the tasks'
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_every_module_has_a_layer():
    unplaced = [m for m in _modules() if _layer(m) is None]
    assert not unplaced, f"no layer in LAYERS names {unplaced}: place each where it belongs"


def test_no_module_imports_from_a_layer_above_its_own():
    upward = _upward(_graph())
    assert not upward, "imports from a layer above:\n" + "\n".join(upward)


def test_the_layer_check_sees_an_import_from_above():
    layers = [("low", ["x.a", "x.sub.*"]), ("high", ["x.*", "x.sub.top"])]
    assert [_layer(m, layers) for m in ("x", "x.a", "x.b", "x.sub", "x.sub.c", "x.sub.top")] == [
        1, 0, 1, 0, 0, 1]
    graph = {"x.a": {"x.b"}, "x.b": {"x.a"}, "x.sub.c": {"x.a", "x.sub.top"}}
    assert _upward(graph, layers) == ["x.a (low) -> x.b (high)",
                                      "x.sub.c (low) -> x.sub.top (high)"]
    # the rules the attention package is built to: a scheme may run kernels and paths; paths,
    # the mechanism, never imports a scheme; kernels import neither
    layer = {m: _layer(m) for m in ("attnlab.attention.kernels.fused", "attnlab.attention.paths",
                                    "attnlab.attention.schemes.dnas")}
    assert (layer["attnlab.attention.kernels.fused"] < layer["attnlab.attention.paths"]
            < layer["attnlab.attention.schemes.dnas"])


def test_the_library_never_imports_the_tasks_and_nothing_imports_bench():
    """bench/ (benchmarks, build-time tools such as triton_offline.py) imports the library, never
    the other way round."""
    modules = _modules()
    offenders = {}
    for name, path in modules.items():
        top = {m.split(".")[0] for m in _imported(path, name, set(modules))}
        if found := top & ({"tasks", "bench"} if name.split(".")[0] == "attnlab" else {"bench"}):
            offenders[name] = sorted(found)
    assert not offenders, offenders


def test_no_code_file_is_over_400_lines():
    code = [p for root in (PACKAGE, TASKS) for p in root.rglob("*") if p.suffix in CODE]
    assert any(p.name == "runner.py" for p in code)  # the walk sees the files
    long = {str(p.relative_to(ROOT)): n for p in code
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: split along a seam: {long}"


def test_the_study_leaves_import_nothing_of_attnlab_but_each_other():
    graph = _graph()
    for leaf in STUDY_LEAVES:
        assert not {m for m in graph[leaf] if m.startswith("attnlab")} - STUDY_LEAVES, leaf


def test_tasks_import_only_the_study_leaves():
    modules = set(_modules())
    offenders = {}
    for path in sorted(TASKS.rglob("*.py")):
        name = _module_name(path)
        study = {m for m in _imported(path, name, modules)
                 if m == "attnlab.study" or m.startswith("attnlab.study.")}
        if study - STUDY_LEAVES:
            offenders[name] = sorted(study - STUDY_LEAVES)
    assert not offenders, offenders
    # the check sees such an import (the claim modules do import the leaves)
    claim = TASKS / "vqa" / "claim.py"
    assert "attnlab.study.evidence" in _imported(claim, "tasks.vqa.claim", modules)
