"""What the reproduction trains: the runs the claims ask for, their settings per mode, the sweeps.

A claim asks for `Run`s (task, model, seed, extra overrides); attnlab.study.launch trains them
(runs that differ only in model and seed share one Hydra multirun), so a run several claims need
is trained once. Everything about a task comes from its card (`task.card.reproduce` in
conf/task/<name>.yaml, read by attnlab.cards): the claims it enters, and its settings per mode,
a few overrides of the task's own config:

- quick: short runs (about a minute of CPU each) that show the machinery and the direction of an
  effect, not the papers' numbers (the card's `quick`, else `GENERIC_QUICK`);
- full: the task's CPU defaults (what `python train.py task=<task>` trains);
- gpu: the task's paper preset (the card's `preset`: `experiment=...`) on `hardware=gpu`.

--quick trains the tasks whose card says `in_quick` (the doubly-normalized attention paper's)
unless --tasks names others: the papers' own tasks of CODA and repulsive attention (`mt`,
`classify`, `lm`) first fetch and tokenize their data and decode with beam search, which alone
would take --quick past its 15 minutes on 2 cores. A task that is not trained is skipped and its
claims say "not run" and why. A new task enters a claim by naming it in its card; nothing here
lists tasks.

A task with a config group of its own name (conf/<task>/<variant>.yaml: the probes,
`task=probe probe=coverage`) enters each of its card's claims once per variant, with the
override `<task>=<variant>`; a variant's file may narrow that to some claims
(`claims: [explaining_away]`, in its group's package: `<task>.claims` once composed). Nothing
here lists variants either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from attnlab.cards import Card, task_cards
from attnlab.study.evidence import Run

MODES = ("quick", "full", "gpu")

# Any task, quick: one short epoch, a few evaluation batches (the analysis callbacks record the
# first 8 validation batches anyway).
GENERIC_QUICK = ("trainer.max_epochs=1", "++trainer.limit_train_batches=100",
                 "++trainer.limit_val_batches=8", "++trainer.limit_test_batches=8")


# Every reproduction run: CSV metrics (the explained-away scalars are read from them), no
# progress bar in the logs, and none of the analyses that no claim reads (they cost evaluations).
# (set to null, not deleted: a task config that already sets one to null, the probes', has no
# key left for `~` to delete)
COMMON = ("++callbacks.progress_bar=null", "++callbacks.head_importance=null", "++callbacks.calibration=null")


@dataclass
class Plan:
    mode: str = "quick"
    root: Path = Path(".")
    wandb: bool = False
    tasks: tuple[str, ...] | None = None  # --tasks: only these (None: every task that exists)
    overrides: tuple[str, ...] = ()  # --override: appended to every training run
    cards: dict[str, Card] = field(init=False, repr=False)  # every task's card, by name

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: use one of {MODES}")
        self.root = Path(self.root)
        self.cards = task_cards(self.root / "conf")

    @property
    def seeds(self) -> tuple[int, ...]:
        """Seeds of each task configuration: quick runs one; full and gpu the papers' three
        (a claim judged on a probe takes more: reproduce/probe_evidence.py)."""
        return (1,) if self.mode == "quick" else (1, 2, 3)

    @property
    def common(self) -> tuple[str, ...]:
        """The overrides every reproduction run gets, after its own."""
        return (f"logger={self.logger}", *COMMON, *self.overrides)

    @property
    def logger(self) -> str:
        return "[csv,wandb]" if self.wandb else "csv"

    @property
    def quick_tasks(self) -> list[str]:
        """What --quick trains when --tasks does not say: the cards with `in_quick`."""
        return [name for name, card in self.cards.items() if card.in_quick]

    def claim_tasks(self, claim: str) -> list[str]:
        """The tasks whose card enters `claim` (the claim's NAME or a task claim's module path)."""
        return [name for name, card in self.cards.items() if claim in card.claims]

    def variants(self, task: str, claim: str | None = None) -> list[tuple[str, ...]]:
        """The extra overrides of each variant of a task (conf/<task>/<variant>.yaml), those that
        enter `claim` when given; [()] for a task without variants."""
        folder = self.root / "conf" / task
        files = sorted(folder.glob("*.yaml")) if folder.is_dir() else []
        if not files:
            return [()]
        found = []
        default = _task_default_claims(self.root / "conf" / "task" / f"{task}.yaml", task)
        for path in files:
            claims = _variant_claims(folder, path.stem, task)
            claims = default if claims is None else claims
            if claim is None or claims is None or claim in claims:
                found.append((f"{task}={path.stem}",))
        return found

    def claim_variants(self, claim: str) -> list[tuple[str, tuple[str, ...]]]:
        """(task, extra overrides) of every task, and variant of it, that enters `claim`."""
        return [(task, extra) for task in self.claim_tasks(claim) for extra in self.variants(task, claim)]

    @staticmethod
    def label(task: str, extra: tuple[str, ...]) -> str:
        """How the report names a task's variant: `probe:coverage` (the task alone without one)."""
        return ":".join([task, *(e.split("=", 1)[1] for e in extra if e.startswith(f"{task}="))])

    def task_exists(self, task: str) -> bool:
        return task in self.cards

    def skip_reason(self, task: str) -> str | None:
        """Why the runs of a task are not trained (None: they are)."""
        if not self.task_exists(task):
            return "the task does not exist yet"
        if self.tasks is not None and task not in self.tasks:
            return "not selected with --tasks"
        if self.tasks is None and self.mode == "quick" and task not in self.quick_tasks:
            return f"--quick trains {', '.join(self.quick_tasks)}; add it with --tasks or use --full"
        return None

    def run(self, task: str, model: str, seed: int, extra: tuple[str, ...] = ()) -> Run:
        """A run of `task` in this mode: the task's settings for the mode, then `extra`."""
        return Run(task, model, seed, (*self.task_overrides(task), *extra))

    def task_overrides(self, task: str) -> list[str]:
        card = self.cards[task]
        if self.mode == "quick":
            return list(GENERIC_QUICK if card.quick is None else card.quick)
        if self.mode == "full":
            return []
        preset = card.preset
        has_preset = preset and (self.root / "conf" / "experiment" / f"{preset}.yaml").is_file()
        return [f"experiment={preset}", "hardware=gpu"] if has_preset else ["hardware=gpu"]

    def setting_text(self, task: str) -> str:
        """How a task was trained, for the report."""
        overrides = [*self.task_overrides(task), *self.overrides]
        return f"{task}: " + (" ".join(overrides) if overrides else "CPU defaults")


def _variant_claims(folder: Path, variant: str, task: str, seen: tuple[str, ...] = ()) -> list | None:
    """A variant file's `claims` (`<task>.claims` in a `# @package _global_` file), or that of the
    sibling it builds on (its `defaults:` names another variant, as conf/probe/hub_key_zipf.yaml
    does hub_key); None: every claim."""
    path = folder / f"{variant}.yaml"
    raw = OmegaConf.load(path)
    claims = OmegaConf.select(raw, f"{task}.claims" if _global(path) else "claims")
    if claims is not None:
        return list(claims)
    for entry in raw.get("defaults") or ():
        parent = str(entry) if isinstance(entry, str) else None
        if parent and parent not in seen and (folder / f"{parent}.yaml").is_file():
            return _variant_claims(folder, parent, task, (*seen, variant))
    return None


def _task_default_claims(path: Path, task: str) -> list | None:
    """The claims a variant enters when neither it nor what it builds on says: the task config's
    own `<task>.claims` default (conf/task/probe.yaml: none), as Hydra composes it; None (every
    claim of the card) where the task config gives none."""
    if not path.is_file():
        return None
    claims = OmegaConf.select(OmegaConf.load(path), f"{task}.claims")
    return None if claims is None else list(claims)


def _global(path: Path) -> bool:
    """Whether a config file's header puts it in the global package (`# @package _global_`);
    otherwise its keys are its group's (conf/probe/<name>.yaml: probe.<key>)."""
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            return False
        if line.split()[1:3] == ["@package", "_global_"]:
            return True
    return False
