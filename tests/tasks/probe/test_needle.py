"""The needle generator (tasks/probe/generators/needle.py): every variant's labels and shortcut
recomputed from the tokens alone by an independent reader, the needle's depth placed exactly,
and the grid's PNG (tasks/probe/module.py write_grid_png)."""

import numpy as np
import pytest

from attnlab.errors import ConfigError
from tasks.probe.data import IGNORE
from tasks.probe.datamodule import ProbeDataModule
from tasks.probe.generators import GENERATORS
from tasks.probe.module import write_grid_png

generate = GENERATORS["needle"]
VARIANTS = ["single", "multikey", "multivalue", "vartrack"]
SIZES = {"num_keys": 10, "num_values": 9, "num_filler": 7}


def ranges(answers: int) -> dict[str, tuple[int, int]]:
    """The token ranges the module docstring gives: pad, ASK_1..m, keys, values, filler."""
    keys = (1 + answers, 1 + answers + SIZES["num_keys"])
    values = (keys[1], keys[1] + SIZES["num_values"])
    return {"keys": keys, "values": values, "filler": (values[1], values[1] + SIZES["num_filler"])}


def read(tokens: list[int], answers: int, variant: str) -> tuple[list[int], list[int], int]:
    """(the answers, the shortcut's answers, where slot 1's entry starts) read from one row's
    tokens: the query block (ASK_j, the asked key) x answers, then the haystack, where a key token
    and the token after it are an entry and anything else is filler or a stray value."""
    r = ranges(answers)
    is_key = lambda t: r["keys"][0] <= t < r["keys"][1]
    is_value = lambda t: r["values"][0] <= t < r["values"][1]
    query = 2 * answers
    assert tokens[0:query:2] == list(range(1, answers + 1))
    asked = tokens[1]
    assert all(t == asked for t in tokens[1:query:2]) and is_key(asked)
    entries, i = [], query
    while i < len(tokens):
        if is_key(tokens[i]):
            entries.append((i, tokens[i], tokens[i + 1]))
            i += 2
        else:
            assert is_value(tokens[i]) or r["filler"][0] <= tokens[i] < r["filler"][1]
            i += 1
    v0 = r["values"][0]
    if variant == "vartrack":
        var, hops = asked, 0
        first = [at for at, k, _ in entries if k == asked]
        while True:
            (bound,) = [b for _, k, b in entries if k == var]  # each variable assigned once
            if is_value(bound):
                break
            var, hops = bound, hops + 1
        values = [b for _, _, b in entries if is_value(b)]
        return [bound - v0], [values[0] - v0], first[0]
    mine = sorted((b, at) for at, k, b in entries if k == asked)
    assert len(mine) == answers and all(is_value(b) for b, _ in mine)
    bound = [b for _, _, b in entries]
    if variant == "single":
        shortcut = [next(t for t in tokens[query:] if is_value(t)) - v0]
    elif variant == "multikey":
        shortcut = [bound[0] - v0]
    else:
        shortcut = [b - v0 for b in sorted(bound)[:answers]]
    return [b - v0 for b, _ in mine], shortcut, mine[0][1]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_the_labels_and_shortcut_are_what_the_tokens_say(variant, seed):
    answers = 3 if variant == "multivalue" else 1
    data = generate(40, seed, variant=variant, length=96, num_answers=answers, num_strays=3,
                    hops=3 if variant == "vartrack" else 2, **SIZES)
    inputs, targets = data.inputs.tolist(), data.targets
    slots = [2 * j for j in range(answers)]
    asked = targets != IGNORE
    assert asked.sum(dim=1).tolist() == [answers] * 40 and asked[:, slots].all()
    for row in range(40):
        labels, shortcut, first = read(inputs[row], answers, variant)
        assert targets[row, slots].tolist() == labels, (variant, seed, row)
        assert data.shortcut.predictions[row, slots].tolist() == shortcut, (variant, seed, row)
        assert int(data.read_at[row, 0]) == first
    assert data.num_classes == SIZES["num_values"] and data.baseline.theory == 1 / SIZES["num_values"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("length", [80, 200])
def test_depth_places_the_needle_exactly(variant, length):
    """depth d puts slot 1's entry at haystack offset round(d * (H - 2)): 0.0 right after the query
    block, 1.0 in the last two tokens; random spreads it over the haystack."""
    answers = 2 if variant == "multivalue" else 1
    query = 2 * answers
    for depth in (0.0, 0.25, 0.5, 0.75, 1.0):
        data = generate(12, 3, variant=variant, length=length, depth=depth, **SIZES)
        expected = query + round(depth * (length - query - 2))
        assert data.read_at[:, 0].tolist() == [expected] * 12, (variant, depth)
        asked = data.inputs[:, 1]
        assert (data.inputs[:, expected] == asked).all()  # the asked key's (variable's) entry
        if depth == 1.0:
            assert expected == length - 2
    spread = generate(200, 3, variant=variant, length=length, depth="random", **SIZES)
    where = spread.read_at[:, 0]
    assert int(where.min()) < query + length // 8 and int(where.max()) > length - length // 8


@pytest.mark.parametrize("options, says", [
    ({"variant": "haystack"}, "variant='haystack' is not a needle variant; use one of single,"),
    ({"depth": 1.5}, "depth=1.5 must be a fraction within 0..1 or random"),
    ({"length": 16}, "length=16 is too short"),
    ({"variant": "single", "num_needles": 3}, "the single variant has one needle"),
    ({"variant": "multikey", "num_needles": 20}, "pass num_keys >= 20"),
])
def test_an_impossible_option_is_one_line(options, says):
    with pytest.raises(ValueError) as err:
        generate(4, 0, **options)
    assert says in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="probe.options of needle"):
        ProbeDataModule("needle", options, n_train=4, n_val=4, n_test=4, data_seed=0,
                        batch_size=4, seed=None, test_options=None).setup()


def test_the_grid_png_is_written_for_one_or_two_options(tmp_path):
    table = {f"length={n},depth={d}": {"acc": n / 1024 * d, "target_mass": 0.1}
             for n in (128, 1024) for d in (0.0, 1.0)}
    grid = {"length": [128, 1024], "depth": [0.0, 1.0]}
    assert write_grid_png(tmp_path / "grid.png", grid, table).stat().st_size > 1000
    one = {f"length={n}": {"acc": 0.5, "target_mass": None} for n in (128, 1024)}
    assert write_grid_png(tmp_path / "one.png", {"length": [128, 1024]}, one).stat().st_size > 1000
    assert write_grid_png(tmp_path / "three.png", {"a": [1], "b": [2], "c": [3]}, {}) is None
    assert not (tmp_path / "three.png").exists()
    assert np.isfinite(0.0)
