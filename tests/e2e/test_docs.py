"""The README and docs/ say what the code does: the model x task matrix is generated from the code
(every registered scheme, every task card), the cheap-to-check parts of every command line they
show (config options, modules, make targets, repository paths, overrides) exist, and every link
between the pages reaches a page and a heading.

    PYTHONPATH=tests python -m e2e.test_docs    # (from the root) the matrix, to paste in
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
from helpers.paths import CONF, ROOT

README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
MATRIX_BEGIN, MATRIX_END = "<!-- matrix:begin -->", "<!-- matrix:end -->"
# the error table shows bad commands on purpose (tests/e2e/test_cli_errors.py checks it)
SKIPPED = ("<!-- error-table:begin -->", "<!-- error-table:end -->")
GROUPS = ("model", "task", "experiment", "hardware", "logger", "callbacks", "debug",
          "hparams_search")


# ----------------------------------------------------------------------------- the matrix
def cell(scheme: str, card) -> str:
    """Where `model=<scheme>` runs in the task: asked of the code that decides it."""
    from omegaconf import OmegaConf

    from attnlab.attention import AttentionSpec
    from attnlab.errors import ConfigError
    from attnlab.runner import check_scheme_fits_task

    cfg = OmegaConf.create({"model": {"name": scheme, "scheme": scheme},
                            "task": {"name": card.name, "causal": card.causal}})
    try:
        check_scheme_fits_task(cfg)
    except ConfigError:
        return "refused"
    spec = AttentionSpec.from_config(scheme)
    if card.encoder_layers is not None and spec.for_decoder() != spec:
        return "encoder"  # the task has a decoder, which stays UNAS
    return "runs"


def matrix() -> str:
    """The README's model x task table: a row per registered scheme, a column per task card."""
    from attnlab.attention import names
    from attnlab.cards import task_cards

    cards = task_cards(CONF)
    lines = ["| `model=` | " + " | ".join(f"`task={t}`" for t in cards) + " |",
             "|---|" + "---|" * len(cards)]
    for scheme in names():
        cells = " | ".join(cell(scheme, card) for card in cards.values())
        lines.append(f"| `{scheme}` | {cells} |")
    return "\n".join(lines)


def between(text: str, begin: str, end: str) -> str:
    return text[text.index(begin) + len(begin): text.index(end)].strip()


def test_readme_matrix_is_generated_from_the_code():
    assert between(README.read_text(), MATRIX_BEGIN, MATRIX_END) == matrix(), (
        "the README's model x task matrix is stale; paste the output of "
        "`PYTHONPATH=tests python -m e2e.test_docs` between its markers")


def test_matrix_follows_the_rule_the_docs_state():
    """Query-normalized schemes are refused by causal tasks and run in every other task's
    encoder; every other scheme runs everywhere."""
    from attnlab.attention import names, query_normalized
    from attnlab.cards import task_cards

    for card in task_cards(CONF).values():
        for scheme in names():
            refused = card.causal and scheme in query_normalized()
            assert (cell(scheme, card) == "refused") == refused, (scheme, card.name)
            if scheme not in query_normalized():
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
            key, _, value = arg.partition("=")
            if "," in value and not value.startswith("["):
                value = value.split(",")[0]
            args.append(f"{key}={value}")
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


if __name__ == "__main__":
    print(matrix())
