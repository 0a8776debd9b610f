"""The README and docs/ say what the code does: the model x task matrix is generated from the code
(every registered scheme, every task card), the cheap-to-check parts of every command line they
show (config options, modules, make targets, repository paths, overrides) exist, every Python name
they write (`attnlab.x.y`, `tasks.x.y`) is defined, docs/architecture.md's layout names every module
that exists and nothing that does not, and every link between the pages reaches a page and a
heading. The matrix itself is written by `make docs` (`python -m attnlab.docs`).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
from helpers.paths import CONF, ROOT

from attnlab.docs import (
    ATTENTION_DOC,
    MATRIX_BEGIN,
    MATRIX_END,
    RESULTS_DOC,
    TEST_RUN_BEGIN,
    TEST_RUN_END,
    TEST_RUN_RECORD,
    between,
    cell,
    duration,
    matrix,
    render,
    suite_figures,
)

README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
# the error table shows bad commands on purpose (tests/e2e/test_cli_errors.py checks it)
SKIPPED = ("<!-- error-table:begin -->", "<!-- error-table:end -->")
GROUPS = ("model", "task", "experiment", "hardware", "logger", "callbacks", "debug",
          "hparams_search")


# ----------------------------------------------------------------------------- the matrix
def test_readme_matrix_is_generated_from_the_code():
    assert between(README.read_text(), MATRIX_BEGIN, MATRIX_END) == matrix(CONF), (
        "the README's model x task matrix is stale (a scheme or a task was added or changed); "
        "run `make docs` (python -m attnlab.docs), which rewrites it between its markers")


def doc_copies(tmp_path: Path) -> list[str]:
    """`attnlab.docs` arguments naming copies of every page it writes, and no measured run: a
    test's `make docs` leaves the checkout's own files alone."""
    for name, page in (("attention.md", ATTENTION_DOC), ("results.md", RESULTS_DOC),
                       ("test_run.json", TEST_RUN_RECORD)):
        (tmp_path / name).write_text(page.read_text())
    return ["--attention-doc", str(tmp_path / "attention.md"), "--results-doc", str(tmp_path / "results.md"),
            "--test-run", str(tmp_path / "test_run.json"), "--measured", str(tmp_path / "none.json")]


def test_make_docs_rewrites_only_the_matrix(tmp_path):
    from attnlab.docs import main

    stale = README.read_text().replace(MATRIX_END, "| `old` | row |\n" + MATRIX_END)
    readme = tmp_path / "README.md"
    readme.write_text(stale)
    others = doc_copies(tmp_path)
    assert main(["--readme", str(readme), "--check", *others]) == 1 and readme.read_text() == stale
    assert main(["--readme", str(readme), *others]) == 0
    assert readme.read_text() == render(README.read_text(), CONF)
    assert between(readme.read_text(), MATRIX_BEGIN, MATRIX_END) == matrix(CONF)
    assert main(["--readme", str(readme), "--check", *others]) == 0


# ----------------------------------------------------------------------------- the test figures
@pytest.mark.parametrize("page", [README, RESULTS_DOC], ids=lambda p: p.name)
def test_the_test_figures_are_the_last_measured_run(page):
    """The suite's count and time in the README and docs/results.md are docs/test_run.json's,
    the last whole `make test` (tests/helpers/measured_run.py fails a run whose count differs)."""
    record = json.loads(TEST_RUN_RECORD.read_text())
    figures = between(page.read_text(), TEST_RUN_BEGIN, TEST_RUN_END)
    assert figures == suite_figures(), f"{page.name}'s test figures are stale; run `make docs`"
    assert f"{record['tests']:,} tests" in figures and duration(record["seconds"]) in figures


def test_make_docs_copies_the_measured_run_and_writes_its_figures(tmp_path):
    from attnlab.docs import main

    others = doc_copies(tmp_path)
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps({"tests": 1234, "passed": 1200, "skipped": 34, "seconds": 299.6,
                                    "cores": 2, "cpu": "a CPU", "load_at_start": 0.1,
                                    "python": "3.11.7", "date": "2026-11-29"}))
    readme = tmp_path / "README.md"
    readme.write_text(README.read_text())
    assert main(["--readme", str(readme), *others, "--measured", str(measured)]) == 0
    assert (tmp_path / "test_run.json").read_text() == measured.read_text()
    for page in (readme, tmp_path / "results.md"):
        assert "**5 min 00 s** for 1,234 tests (1,200 passed, 34 skipped) on 2 cores" in page.read_text()
    assert main(["--readme", str(readme), *others, "--check"]) == 0


def test_matrix_follows_the_rule_the_docs_state():
    """Query-normalized schemes are refused by causal tasks and run in every other task's
    encoder; causal-only schemes (stickbreaking) are refused by every task that is not causal
    (an encoder-decoder task applies the scheme to its encoder); every other scheme runs
    everywhere."""
    from attnlab.attention import AttentionSpec
    from attnlab.attention.schemes import names, query_normalized
    from attnlab.cards import task_cards

    causal_only = {n for n in names() if AttentionSpec.from_config(n).causal_only}
    for card in task_cards(CONF).values():
        for scheme in names():
            refused = (card.causal and scheme in query_normalized()) or (
                not card.causal and scheme in causal_only)
            assert (cell(scheme, card) == "refused") == refused, (scheme, card.name)
            if scheme not in query_normalized() and not refused:
                assert cell(scheme, card) == "runs", (scheme, card.name)


# ----------------------------------------------------------------------------- command lines
def doc_code(path: Path) -> list[str]:
    """The code a page shows: indented or fenced lines, and inline `spans` (joined across line
    breaks), outside the error table."""
    text = path.read_text()
    if SKIPPED[0] in text:
        text = text[: text.index(SKIPPED[0])] + text[text.index(SKIPPED[1]):]
    code, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            if code and code[-1].endswith("\\"):  # a shell line continued on the next
                code[-1] = code[-1][:-1] + line.strip()
            else:
                code.append(line.strip())
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    prose = "\n".join(line for line in prose.splitlines() if not line.startswith("    "))
    code += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]
    return code


CODE = {path.name: doc_code(path) for path in DOCS}
PAGES = list(CODE)


@pytest.mark.parametrize("page", PAGES)
def test_every_config_option_named_exists(page):
    """`model=hnas`, `task=vqa,mlm`, `logger=[csv,tensorboard]`, ...: each a
    conf/<group>/<option>.yaml."""
    pattern = re.compile(r"(?<![\w./+~-])(" + "|".join(GROUPS) + r")=([\w\[\],|\\]+)")
    missing = []
    for code in CODE[page]:
        for group, values in pattern.findall(code):
            for value in re.split(r"[,|\\\[\]]+", values):
                if value and not (CONF / group / f"{value}.yaml").is_file():
                    missing.append(f"{group}={value}")
    assert not missing, f"{page} names options that do not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("page", PAGES)
def test_every_module_make_target_and_path_named_exists(page):
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, flags=re.MULTILINE))
    missing = []
    for code in CODE[page]:
        for module in re.findall(r"python -m ([\w.]+)", code):
            if importlib.util.find_spec(module) is None:
                missing.append(f"python -m {module}")
        for target in re.findall(r"(?:^|\s)make ([\w-]+)", code):
            if target not in targets:
                missing.append(f"make {target}")
        paths = re.findall(r"(?<![\w./-])((?:src|tasks|conf|tests|bench|docs)/[\w./:-]*)", code)
        for path in paths:
            path, _, test = path.rstrip(".,:").partition("::")
            if not (ROOT / path).exists():
                missing.append(path)
            elif test and f"def {test.split('[')[0]}(" not in (ROOT / path).read_text():
                missing.append(f"{path}::{test}")
    assert not missing, f"{page} names what does not exist: {sorted(set(missing))}"


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES)
def test_every_link_between_pages_resolves(page):
    """`[text](docs/tasks.md#a-new-task)`: the file exists and has that heading."""
    path = next(p for p in DOCS if p.name == page)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if "://" in target:
            continue
        file, _, fragment = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(target)
        elif fragment:
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.MULTILINE)
            if fragment not in {anchor(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{page} links to what does not exist: {broken}"


PACKAGES = {"attnlab": ROOT / "src" / "attnlab", "tasks": ROOT / "tasks"}


def defined_names(body: list) -> dict[str, list | None]:
    """{name: the body of its class, [] for anything else, None when imported (not followed)} of
    what a module or class body defines or imports."""
    import ast

    names: dict[str, list] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = []
        elif isinstance(node, ast.ClassDef):
            names[node.name] = node.body
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: None for a in node.names})
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update({n.id: [] for target in targets for n in ast.walk(target)
                          if isinstance(n, ast.Name)})
        elif isinstance(node, (ast.If, ast.Try)):  # definitions under `if TYPE_CHECKING:` / `try:`
            names.update(defined_names(node.body))
    return names


def resolves(dotted: str) -> bool:
    """`attnlab.cards.task_cards`, `tasks.vqa.claim`, `attnlab.task_module.TaskModule.task_loss`:
    the longest prefix that is a module file or package, then names it defines (read, not
    imported: importing every module a page names costs tens of seconds)."""
    import ast

    root, *parts = dotted.split(".")
    path = PACKAGES[root]
    while parts and ((path / parts[0]).is_dir() or (path / f"{parts[0]}.py").is_file()):
        path = path / parts[0] if (path / parts[0]).is_dir() else path / f"{parts.pop(0)}.py"
        if path.is_dir():
            parts.pop(0)
    source = path / "__init__.py" if path.is_dir() else path
    body = ast.parse(source.read_text()).body if source.is_file() else []
    for name in parts:
        names = defined_names(body)
        if name not in names:
            return False
        if names[name] is None:
            return True  # imported from elsewhere: that module's own names are not followed
        body = names[name]
    return True


@pytest.mark.parametrize("page", PAGES)
def test_every_python_name_named_exists(page):
    """`attnlab.task_module.TaskModule`, `tasks.common.optim.inverse_sqrt_schedule`, ...: a module
    or attribute a page names in code resolves (a renamed or moved one fails here)."""
    missing = set()
    for code in CODE[page]:
        for name in re.findall(r"(?<![\w./-])((?:attnlab|tasks)(?:\.\w+)+)", code):
            if not resolves(name):
                missing.add(name)
    assert not missing, f"{page} names modules or attributes that do not exist: {sorted(missing)}"


def test_the_name_check_tells_moved_names_from_present_ones():
    """Names the rebuild moved fail; where they went, and a method of a class, pass."""
    assert not resolves("attnlab.study.reproduce.multiview_vqa") and resolves("tasks.vqa.claim")
    assert not resolves("attnlab.attention.kernels.fused.nope")
    assert resolves("attnlab.attention.schemes.transform.LogitTransform.row_wise")
    assert not resolves("attnlab.task_module.TaskModule.replace_training_step")


# ----------------------------------------------------------------------------- the layout
# the folders whose every module and subfolder docs/architecture.md's layout names, one line each
COMPLETE = ("src/attnlab", "src/attnlab/attention", "src/attnlab/attention/kernels",
            "src/attnlab/callbacks", "src/attnlab/study", "src/attnlab/study/compare",
            "src/attnlab/study/reproduce", "tasks/common")


def layout() -> set[str]:
    """The paths docs/architecture.md's layout names: each entry's names (before the gap that starts
    its description, comma-separated) inside the folder of the nearest entry above it with less
    indentation; lines indented past the names are descriptions carried over."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    text = text[text.index("## Layout\n"):]
    block = text[: text.index("\n## ", 1)]
    named: set[str] = set()
    parents: list[tuple[int, str]] = []  # (indentation, folder), innermost last
    for line in block.splitlines():
        match = re.match(r"^( {4,19})(\S.*?)(?: {2,}|$)", line)
        if not match:
            continue  # blank, or a description carried over
        indent = len(match.group(1))
        while parents and parents[-1][0] >= indent:
            parents.pop()
        folder = parents[-1][1] if parents else ""
        names = [folder + name for name in match.group(2).split(", ")]
        named.update(names)
        parents.append((indent, names[-1]))
    return named


def test_the_layout_names_what_exists_and_everything_that_exists():
    named = layout()
    assert "src/attnlab/attention/kv_cache.py" in named and "tasks/common/" in named  # parsed
    stale = sorted(n for n in named if "<" not in n and not (ROOT / n).exists())
    assert not stale, f"docs/architecture.md's layout names what does not exist: {stale}"
    unnamed = []
    for folder in COMPLETE:
        for path in sorted((ROOT / folder).iterdir()):
            if path.name.startswith(("__", ".")):
                continue  # __init__.py, __main__.py, __pycache__
            if path.suffix == ".py" or (path.is_dir() and any(path.glob("*.py"))) or path.name == "csrc":
                entry = f"{folder}/{path.name}" + ("/" if path.is_dir() else "")
                if entry not in named:
                    unnamed.append(entry)
    assert not unnamed, (f"docs/architecture.md's layout lacks {unnamed}: give each a line "
                         f"(its name and what it is) under its folder")


def commands(page: str) -> list[tuple[str, list[str]]]:
    """(script, overrides) of every `python train.py ...` / `python eval.py ...` the page shows,
    with placeholders (`<dir>`, `...`), flags and Hydra's own settings left out, and a sweep's
    comma lists cut to their first value."""
    found = []
    for code in CODE[page]:
        match = re.search(r"python (train|eval)\.py\b(.*)", code)
        if not match:
            continue
        args = []
        # a placeholder may hold spaces (`<number of GPUs>`)
        for arg in shlex.split(re.sub(r"<[^>]*>", "<>", match.group(2)), comments=True):
            if arg.startswith(("-", "hydra")) or "<" in arg or "..." in arg:
                continue
            key, equals, value = arg.partition("=")
            if "," in value and not value.startswith("["):
                value = value.split(",")[0]
            args.append(f"{key}={value}" if equals else arg)  # `~callbacks.x` deletes, no value
        if (match.group(1), args) not in found:
            found.append((match.group(1), args))
    return found


@pytest.fixture(scope="module")
def compose(tmp_path_factory):
    """`compose(script, overrides)`: Hydra's compose of this checkout's conf/, each distinct
    command once for the whole module (pages repeat commands; composing is the slow part)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from attnlab import config_args

    out = tmp_path_factory.mktemp("composed")
    config_args.register(CONF)
    done: dict = {}

    def composed(script: str, overrides: list[str]):
        key = (script, tuple(overrides))
        if key not in done:
            try:
                done[key] = hydra_compose(script, overrides=[*overrides, f"paths.output_dir={out}"])
            except Exception as error:  # noqa: BLE001 - reported by the test with its command
                done[key] = error
        return done[key]

    with initialize_config_dir(str(CONF), version_base="1.3"):
        yield composed


@pytest.mark.parametrize("page", PAGES)
def test_every_command_line_composes(page, compose):
    """Every override a shown command line uses exists in the config it composes (a renamed key
    fails here: Hydra's configs are structs)."""
    failed = []
    for script, args in commands(page):
        result = compose(script, args)
        if isinstance(result, Exception):
            failed.append(f"python {script}.py {' '.join(args)}: {str(result).splitlines()[0]}")
    assert not failed, f"{page}: commands that do not compose:\n" + "\n".join(failed)


@pytest.fixture(scope="module")
def composed(compose) -> list:
    """The config of every task (default model) and of every model (default task, every logger):
    each key a page names must be in one of them."""
    runs = [[f"task={p.stem}"] for p in sorted((CONF / "task").glob("*.yaml"))]
    runs += [[f"model={p.stem}", "logger=many"] for p in sorted((CONF / "model").glob("*.yaml"))]
    return [compose("train", run) for run in runs]


@pytest.mark.parametrize("page", PAGES)
def test_every_override_named_exists(page, composed):
    """`task.module.optimizer.lr=3e-4`, `callbacks.repulsive.method=spos`, ... anywhere on a page
    (prose included): the key is in the composed config of some task or model."""
    from omegaconf import OmegaConf

    roots = ("task", "model", "trainer", "callbacks", "logger", "paths")
    pattern = re.compile(r"^[+~]?((?:" + "|".join(roots) + r")(?:\.\w+)+)=")
    absent = object()
    missing = set()
    for code in CODE[page]:
        for token in code.split():
            match = pattern.match(token.strip("'\""))
            if match and not any(OmegaConf.select(cfg, match.group(1), default=absent,
                                                  throw_on_missing=False) is not absent
                                 for cfg in composed):
                missing.add(match.group(1))
    assert not missing, f"{page} names keys no config has: {sorted(missing)}"
