"""The library's layout: no import cycle among the modules of src/attnlab, nothing there imports
the tasks, and no code file is over ~400 lines. Read from the source with `ast` (nothing is
imported), counting imports inside functions too: a lazy import that breaks a cycle at run time
is still a cycle in the design."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.paths import ROOT

SRC = ROOT / "src"
PACKAGE = SRC / "attnlab"
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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
    files = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph = {}
    for name, path in files.items():
        imported = _with_packages(_imported(path, name, set(files)), name)
        if path.name == "__init__.py" and "iter_modules(__path__)" in path.read_text():
            # a package that imports every module in it (attention/schemes: the registry)
            imported |= {m for m in files if m.rpartition(".")[0] == name}
        graph[name] = {m for m in imported if m in files and m != name}
        graph[name] |= {m for m in imported if m == "tasks" or m.startswith("tasks.")}
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


def test_the_library_has_no_import_cycle():
    graph = _graph()
    assert "attnlab.attention.record" in graph["attnlab.attention.mha"]  # the walk sees imports
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_library_never_imports_the_tasks():
    offenders = {name: sorted(m for m in deps if m.split(".")[0] == "tasks")
                 for name, deps in _graph().items()}
    assert not {name: deps for name, deps in offenders.items() if deps}


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_attention_code_file_is_over_400_lines():
    code = [p for p in (PACKAGE / "attention").rglob("*") if p.suffix in (".py", ".cpp", ".h")]
    long = {str(p.relative_to(SRC)): n for p in code if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long


# the modules of attnlab.study a task may import: the shared leaves, never the drivers (which
# import a task's claim module by name from its card: a task importing them back would be a cycle
# through a string, invisible to the graph above)
STUDY_LEAVES = {"attnlab.study.evidence", "attnlab.study.stats"}


def test_the_study_leaves_import_nothing_of_attnlab():
    graph = _graph()
    for leaf in STUDY_LEAVES:
        assert not {m for m in graph[leaf] if m.startswith("attnlab")}, leaf


def test_tasks_import_only_the_study_leaves():
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    offenders = {}
    for path in sorted((ROOT / "tasks").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        study = {m for m in _imported(path, name, modules)
                 if m == "attnlab.study" or m.startswith("attnlab.study.")}
        if study - STUDY_LEAVES:
            offenders[name] = sorted(study - STUDY_LEAVES)
    assert not offenders, offenders
    # the check sees such an import (the claim modules do import the leaves)
    claim = ROOT / "tasks" / "vqa" / "claim.py"
    assert "attnlab.study.evidence" in _imported(claim, "tasks.vqa.claim", modules)
