"""`python -m attnlab.compare` in this process, without training: a bad choice is one error line
and exit code 2, and --dry-run prints the first stage's train.py sweeps."""

import sys

import pytest
from helpers.paths import CONF, ROOT

from attnlab.attention.schemes import fitting, names
from attnlab.study.compare import cli
from attnlab.study.compare.plan import COMMON, discover
from attnlab.study.compare.probes import probe_cards
from attnlab.study.launch import slug


@pytest.mark.parametrize("args, says", [
    (["--probes", "recal"], "error: --probes recal: unknown ['recal']; choose from assignment, "),
    (["--probes", "hub_key,nope,zzz"], "error: --probes hub_key,nope,zzz: unknown ['nope', 'zzz']"),
    (["--probes", ","], "error: --probes ,: unknown []; choose from "),
    (["--schemes", "dnas,softmax"],
     "error: --schemes dnas,softmax: unknown ['softmax']; choose from coda, "),
    (["--seeds", "1"], ("error: --seeds 1 --jobs 2: --seeds takes a number >= 2 (a paired test "
                        "needs two seeds), --jobs >= 1")),
    (["--seeds", "0"], "error: --seeds 0 --jobs 2: --seeds takes a number >= 2"),
    (["--seeds", "4", "--jobs", "0"], "error: --seeds 4 --jobs 0: "),
])
def test_a_bad_choice_is_one_error_line_and_exit_2(args, says, tmp_path, capsys):
    jobs = [] if "--jobs" in args else ["--jobs", "2"]
    assert cli.main([*args, *jobs, "--out", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(says) and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_bad_seed_count_is_argparses_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--seeds", "two"])
    assert exit_.value.code == 2
    assert "argument --seeds: invalid int value: 'two'" in capsys.readouterr().err


def test_dry_run_prints_the_learning_rate_stage(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["--dry-run", "--probes", "unmatched_key", "--schemes", "dnas",
                     "--jobs", "1", "--out", str(out)]) == 0
    *lines, note = capsys.readouterr().out.splitlines()
    assert note == "# later stages (pilot, power, controls) depend on these runs' results"
    assert len(lines) == 3  # the grid's three rates, unas and dnas in each sweep
    for line, lr in zip(lines, ("0.001", "0.003", "0.009")):
        extra = ("probe=unmatched_key", f"task.module.optimizer.lr={lr}")
        assert line == " ".join([sys.executable, str(ROOT / "train.py"), "-m", "task=probe",
                                 "model=unas,dnas", "seed=1", *extra, *COMMON,
                                 f"hydra.sweep.dir={out / 'runs' / slug('probe', extra)}-a?"])
    assert not out.exists()  # nothing trained, nothing written


def test_dry_run_without_a_grid_is_the_pilot_and_quick_is_the_primary_family(tmp_path, capsys):
    args = ["--dry-run", "--no-lr-grid", "--jobs", "1", "--out", str(tmp_path)]
    assert cli.main([*args, "--probes", "hub_key", "--seeds", "3", "--override",
                     "trainer.max_epochs=1"]) == 0
    (line, _) = capsys.readouterr().out.splitlines()
    assert (" -m task=probe model=unas,dnas,hnas,sinkhorn seed=1,2,3 probe=hub_key "
            f"task.module.optimizer.lr=0.003 trainer.max_epochs=1 {' '.join(COMMON)} ") in line
    assert cli.main(args) == 0  # quick: the primary probes, each with its own schemes
    lines = capsys.readouterr().out.splitlines()[:-1]
    primary = [n for n, card in probe_cards(CONF).items() if card.primary]
    assert len(primary) >= 2
    assert sorted(x.split(" probe=")[1].split()[0] for x in lines) == primary
    assert all(" seed=1,2,3 " in x for x in lines)  # the pilot's seeds
    assert cli.main([*args, "--full", "--probes", "listops"]) == 0
    (line, _) = capsys.readouterr().out.splitlines()
    # every model config but UNAS after it, and none the probes' attention cannot take (causal only)
    every = ",".join(["unas", *(m for m in discover(CONF, "model")
                                if m != "unas" and (m not in names() or m in fitting(causal=False)))])
    assert "stickbreaking" not in every and "selective" not in every and "sink" in every
    assert f" model={every} seed=1,2,3 probe=listops probe.options.seq_len=64 " in line
    assert cli.main([*args, "--gpu", "--probes", "listops", "--schemes", "dnas"]) == 0
    assert " probe=listops hardware=gpu probe.options.seq_len=512 " in capsys.readouterr().out
