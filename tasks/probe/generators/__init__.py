"""The probe generators, one module per generator, each with
`generate(n, seed, **options) -> ProbeData` (tasks/probe/data.py), every option with a default:

    recall      associative recall (Zoology's MQAR), with duplicate and distractor keys
    clusters    unbalanced clusters of points: count them, or find the minority's centre
    retrieval   an ordered tuple read at several marked positions: one head per position
    listops     ListOps (the Long Range Arena's rules) at reduced length
    unmatched   the one object of a list that another lacks: explaining away (DNAS)
    hub         many queries asking one key: the cost of normalizing over queries
    assignment  queries matched with keys by rank: the 1-D optimal transport plan (Sinkhorn)
    needle      long-context retrieval after RULER: single / multi-key / multi-value needles,
                variable tracking, at a set length and needle depth

Every module of this package is imported here and its `generate` is `GENERATORS[<module name>]`,
the name a conf/probe/<name>.yaml gives as `generator:`; so a new generator is one file in this
folder (plus its YAML), and nothing else lists it (docs/tasks.md, "A new probe"). A module whose
name starts with `_` is a helper, not a generator. A module without `generate` is an error naming
its file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path

from attnlab.errors import ConfigError
from tasks.probe.data import ProbeData

Generator = Callable[..., ProbeData]

# {module name: its generate}, filled by discover() (kept the same object: callers may hold it)
GENERATORS: dict[str, Generator] = {}


def _where(module) -> str:
    """The module's file, relative to the checkout where it lies inside it."""
    path = Path(getattr(module, "__file__", None) or module.__name__)
    try:
        return path.resolve().relative_to(Path(__file__).resolve().parents[3]).as_posix()
    except ValueError:
        return str(path)


def discover() -> dict[str, Generator]:
    """Import every module of this package (of every folder on its `__path__`) and map its name
    to its `generate`, in name order; `GENERATORS` is updated in place and returned (call it
    again to pick up a module added since)."""
    importlib.invalidate_caches()
    found: dict[str, Generator] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        generate = getattr(module, "generate", None)
        if not callable(generate):
            raise ConfigError(
                f"{_where(module)} defines no `generate(n, seed, **options) -> ProbeData`, "
                f"which every module of tasks/probe/generators/ must (docs/tasks.md, a new "
                f"probe); add it, or name the file _{info.name}.py if it only helps generators")
        found[info.name] = generate
    GENERATORS.clear()
    GENERATORS.update(found)
    return GENERATORS


def generator(name: str) -> Generator:
    """The `generate` of `probe.generator=<name>`; a name no module has is a ConfigError listing
    those that exist."""
    if name not in GENERATORS:
        raise ConfigError(f"probe.generator={name!r} is not a probe generator; use one of "
                          f"{', '.join(GENERATORS)} (the modules of tasks/probe/generators/)")
    return GENERATORS[name]


discover()

__all__ = ["GENERATORS", "Generator", "discover", "generator"]
