"""What a comparison trains: every scheme x every probe x seeds, as `train.py -m` sweeps.

Nothing here lists schemes or probes: the schemes are `conf/model/*.yaml` (each a `model=`
choice), the probes `conf/probe/*.yaml` (each a `probe=` choice of the probe task). The settings
per mode come from the probe configs:

- quick: the probe task's CPU defaults (sized for this: seconds per run), 3 seeds;
- full: 5 seeds, plus the probe's own `probe.compare.full` overrides (longer sequences) if its
  config has them;
- gpu: 5 seeds, `hardware=gpu` plus the probe's `probe.compare.gpu` overrides (lengths and
  widths that need a GPU).

A run is (probe, scheme, seed). A run that an earlier invocation with the same --out finished
with the same overrides (its metrics.json says ok) is reused; the others are trained again, each
probe's in a new sweep dir (`runs/<probe>-a<attempt>`), so nothing is overwritten.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from attnlab.report import load_jobs

MODES = ("quick", "full", "gpu")
SEEDS = {"quick": 3, "full": 5, "gpu": 5}
TASK = "probe"  # the task whose configs the probes select (conf/task/probe.yaml)
BASELINE_SCHEME = "unas"  # what every scheme is compared with: softmax attention

# Every comparison run: CSV metrics only (no W&B run per job), no progress bar in the logs
# (Lightning adds its own unless told not to); the analyses are the probe task's own choice
# (conf/task/probe.yaml: callbacks).
COMMON = ("logger=csv", "~callbacks.progress_bar", "trainer.enable_progress_bar=false")


def discover(conf_dir: Path, group: str) -> list[str]:
    """The choices of a config group: the stems of conf/<group>/*.yaml, in name order."""
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def probe_mode_overrides(conf_dir: Path, probe: str, mode: str) -> list[str]:
    """The probe config's own overrides for `mode` (`probe.compare.<mode>`), [] where none."""
    raw = OmegaConf.load(conf_dir / "probe" / f"{probe}.yaml")
    node = OmegaConf.select(raw, f"probe.compare.{mode}")
    return [str(o) for o in (OmegaConf.to_container(node) if node is not None else [])]


@dataclass(frozen=True)
class Run:
    probe: str
    model: str
    seed: int


@dataclass
class ComparePlan:
    """The runs of one invocation and the overrides that train them."""

    root: Path  # the checkout (train.py, conf/)
    mode: str = "quick"
    schemes: list[str] = field(default_factory=list)
    probes: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    extra: tuple[str, ...] = ()  # --override: appended to every run

    @property
    def conf_dir(self) -> Path:
        return self.root / "conf"

    @property
    def runs(self) -> list[Run]:
        return [Run(p, m, s) for p in self.probes for m in self.schemes for s in self.seeds]

    def overrides(self, probe: str) -> list[str]:
        """Every override of a probe's runs but model= and seed=."""
        mode = ["hardware=gpu"] if self.mode == "gpu" else []
        if self.mode != "quick":
            mode += probe_mode_overrides(self.conf_dir, probe, self.mode)
        return [f"task={TASK}", f"probe={probe}", *mode, *COMMON, *self.extra]


@dataclass
class CompareSweep:
    """One `train.py -m` of one probe: models x seeds. Duck-types attnlab.reproduce.plan.Sweep
    (slug, runs, overrides(plan)), so that reproduce's launcher runs it."""

    slug: str
    probe: str
    models: list[str]
    seeds: list[int]
    runs: list[Run]

    def overrides(self, plan: ComparePlan) -> list[str]:
        base = plan.overrides(self.probe)
        models, seeds = ",".join(self.models), ",".join(map(str, self.seeds))
        return [*base[:2], f"model={models}", f"seed={seeds}", *base[2:]]


def _normalized(overrides: list[str]) -> set[str]:
    """Overrides as a sweep job records them: Hydra writes each value back from its parsed form
    (`false` -> `False`, `~key` -> `~key=null`), so both sides go through its parser."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:  # a malformed --override: train.py will say what is wrong with it
        return set(overrides)
    out = set()
    for override in parsed:
        if override.is_delete() and override.value() is None:
            out.add(override.get_key_element())
        else:
            out.add(f"{override.get_key_element()}={override.get_value_element_as_str()}")
    return out


def reusable(record: dict, plan: ComparePlan, run: Run) -> bool:
    """A finished job of `run` trained with exactly the overrides this plan would give it."""
    if record.get("status") != "ok":
        return False
    expected = {*plan.overrides(run.probe), f"model={run.model}", f"seed={run.seed}"}
    return _normalized(record.get("overrides", [])) == _normalized(sorted(expected))


def probe_of(record: dict) -> str | None:
    given = record.get("overrides", [])
    return next((o.split("=", 1)[1] for o in given if o.startswith("probe=")), None)


def finished_runs(plan: ComparePlan, runs_dir: Path) -> dict[Run, dict]:
    """The records under runs_dir (every earlier attempt) that this plan can reuse, by Run."""
    found: dict[Run, dict] = {}
    for record in load_jobs(runs_dir) if runs_dir.is_dir() else []:
        run = Run(str(probe_of(record)), str(record.get("model")), int(record.get("seed", -1)))
        if run not in found and reusable(record, plan, run):
            found[run] = record
    return found


def next_attempt(runs_dir: Path, probe: str) -> int:
    taken = [int(p.name.rsplit("-a", 1)[1]) for p in runs_dir.glob(f"{probe}-a*")
             if p.is_dir() and p.name.rsplit("-a", 1)[1].isdigit()]
    return max(taken, default=0) + 1


def sweeps_for(missing: list[Run], runs_dir: Path, jobs: int = 1) -> list[CompareSweep]:
    """The sweeps that train the missing runs: per probe, the models that miss the same seeds
    share one sweep (a rectangle models x seeds); while there are fewer sweeps than `jobs`, the
    largest is split in two by its models, so that a single probe still keeps every core busy.
    The largest first (the last to finish is then short)."""
    seeds_of: dict[tuple[str, str], list[int]] = defaultdict(list)
    for run in missing:
        seeds_of[(run.probe, run.model)].append(run.seed)
    groups: dict[tuple[str, tuple[int, ...]], list[str]] = defaultdict(list)
    for (probe, model), seeds in seeds_of.items():
        groups[(probe, tuple(sorted(seeds)))].append(model)
    shapes = [(probe, models, seeds) for (probe, seeds), models in groups.items()]
    while len(shapes) < jobs and any(len(models) > 1 for _, models, _ in shapes):
        probe, models, seeds = max(shapes, key=lambda g: len(g[1]) * len(g[2]))
        shapes.remove((probe, models, seeds))
        half = (len(models) + 1) // 2
        shapes += [(probe, models[:half], seeds), (probe, models[half:], seeds)]
    sweeps, attempts = [], {}
    for probe, models, seeds in sorted(shapes, key=lambda g: -len(g[1]) * len(g[2])):
        attempts[probe] = attempts.get(probe, next_attempt(runs_dir, probe) - 1) + 1
        runs = [Run(probe, m, s) for m in models for s in seeds]
        sweeps.append(CompareSweep(f"{probe}-a{attempts[probe]}", probe, models, list(seeds), runs))
    return sweeps
