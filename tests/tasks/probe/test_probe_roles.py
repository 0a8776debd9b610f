"""What the probe rework added: roles (key_only / query_only) in the network and the encoder
layer, auxiliary targets in the loss and never in the score, the learning-curve area
(val/acc_auc) and its checkpoint, head collisions, the shortcut per split (a rule scored on the
split; clusters' classifier fitted on the training rows only) and the count of scored answers."""

import copy
from collections import Counter
from functools import partial

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger

from attnlab.attention import TransformerEncoderLayer, record_attention
from tasks.probe.data import IGNORE
from tasks.probe.datamodule import ProbeDataModule
from tasks.probe.module import ProbeModule, collisions
from tasks.probe.network import ProbeEncoder

SCHEMES = ["unas", "dnas", "hnas", "sinkhorn", "coda"]
QUERY_NORMALIZED = {"dnas", "hnas", "sinkhorn"}  # the keys' columns are normalized over queries

# one row layout: 0..2 key_only, 3..5 both roles, 6..8 query_only, 9 padding
L = 10
KEY_ONLY, BOTH, QUERY_ONLY, PADDING = [0, 1, 2], [3, 4, 5], [6, 7, 8], [9]


def roles(batch: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens = torch.randint(1, 12, (batch, L))
    padding = torch.zeros(batch, L, dtype=torch.bool)
    padding[:, PADDING] = True
    tokens[padding] = 0
    key_only = torch.zeros_like(padding)
    key_only[:, KEY_ONLY] = True
    query_only = torch.zeros_like(padding)
    query_only[:, QUERY_ONLY] = True
    return tokens, padding, key_only, query_only


def encoder(scheme: str, layers: int = 1, shift: bool = False, **kw) -> ProbeEncoder:
    """One attention layer and no token shift (the shift would carry a token to its neighbours
    before any attention), so that what a position reads is what attention gives it."""
    torch.manual_seed(0)
    return ProbeEncoder(5, L, vocab_size=12, attention=scheme, d_model=16, nhead=2,
                        num_layers=layers, dim_feedforward=32, token_shift=shift, positions="learned",
                        **kw).eval()


def changed_positions(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    return ((a - b).abs().amax(-1) > 1e-5).any(0).nonzero().flatten().tolist()


# ----------------------------------------------------------------------------- roles
@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_query_only_position_is_never_read(scheme, one_thread):
    """Whatever keys and values the query_only (and padded) positions offer, no position's
    logits change, its own included; their columns get no weight from any query."""
    net = encoder(scheme)
    tokens, padding, key_only, query_only = roles()
    attention = net.layers[0].self_attn
    scrambled_rows = {"where": query_only | padding}

    def scramble(module, args, out):  # garbage keys / values at the positions nobody may read
        noise = 100 * torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        return torch.where(scrambled_rows["where"][..., None], noise, out)

    with torch.no_grad(), record_attention(net) as recorder:
        base = net(tokens, padding, key_only, query_only)
    weights = next(iter(recorder.records.values())).weights  # (B, H, S_q, S_k)
    assert weights[:, :, :, QUERY_ONLY + PADDING].abs().max() == 0
    assert weights[:, :, BOTH + QUERY_ONLY][..., KEY_ONLY + BOTH].sum(-1).gt(0.5).all()  # read
    hooks = [attention.k_proj.register_forward_hook(scramble),
             attention.v_proj.register_forward_hook(scramble)]
    try:
        with torch.no_grad():
            scrambled = net(tokens, padding, key_only, query_only)
    finally:
        for hook in hooks:
            hook.remove()
    assert torch.isfinite(base).all()
    torch.testing.assert_close(scrambled[~padding], base[~padding], atol=1e-5, rtol=1e-5)
    # the hooks do reach the attention: scrambling a position that is read changes things
    scrambled_rows["where"] = key_only
    with torch.no_grad():
        hook = attention.v_proj.register_forward_hook(scramble)
        try:
            assert changed_positions(net(tokens, padding, key_only, query_only), base)
        finally:
            hook.remove()


@pytest.mark.parametrize("scheme", ["unas", "dnas"])
def test_a_query_only_token_reaches_others_only_by_query_competition(scheme, one_thread):
    """Changing a query_only position's token changes its own logits. Under softmax over keys
    nothing else changes (it is never read); under DNAS the other queries' logits change too,
    because it still takes its share of every key's column (it is a query), and the key_only
    positions, which ask nothing, never change."""
    net = encoder(scheme)
    tokens, padding, key_only, query_only = roles()
    other = tokens.clone()
    other[:, 7] = 1 + tokens[:, 7] % 11
    with torch.no_grad():
        moved = changed_positions(net(tokens, padding, key_only, query_only),
                                  net(other, padding, key_only, query_only))
    if scheme in QUERY_NORMALIZED:
        assert moved == BOTH + QUERY_ONLY
    else:
        assert moved == [7]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_key_only_position_asks_nothing_but_is_read(scheme, one_thread):
    """A key_only position's logits are those of the same network with its attention output
    zeroed (the residual path through the output projection's bias); changing its token
    changes the queries that read it and no other key_only position."""
    net = encoder(scheme)
    tokens, padding, key_only, query_only = roles()
    attention = net.layers[0].self_attn
    with torch.no_grad():
        base = net(tokens, padding, key_only, query_only)
        attend = attention.attend_heads

        def silent(*args, **kwargs):  # every head's output 0, before the output projection
            out, logits = attend(*args, **kwargs)
            return torch.zeros_like(out), logits

        attention.attend_heads = silent
        try:
            zeroed = net(tokens, padding, key_only, query_only)
        finally:
            del attention.attend_heads
        torch.testing.assert_close(base[key_only], zeroed[key_only], atol=1e-6, rtol=1e-6)
        assert changed_positions(base, zeroed) == BOTH + QUERY_ONLY  # the queries do read
        other = tokens.clone()
        other[:, 1] = 1 + tokens[:, 1] % 11
        moved = changed_positions(base, net(other, padding, key_only, query_only))
    assert moved == [1] + BOTH + QUERY_ONLY


@pytest.mark.parametrize("scheme", ["unas", "dnas", "coda"])
def test_no_roles_and_roles_all_false_are_the_same_network(scheme, one_thread):
    """Padding alone as before: roles that are all False change nothing (2 layers, the shift on,
    a padded row), and a layer given no query_padding_mask masks its padded queries as before."""
    net = encoder(scheme, layers=2, shift=True)
    tokens, padding, _, _ = roles()
    padding[0, 5:] = True
    tokens[padding] = 0
    none = torch.zeros_like(padding)
    with torch.no_grad():
        torch.testing.assert_close(net(tokens, padding, none, none), net(tokens, padding))
        torch.testing.assert_close(net(tokens, padding, key_only=none), net(tokens, padding))
        torch.testing.assert_close(net(tokens, padding, query_only=none), net(tokens, padding))
    torch.manual_seed(0)
    layer = TransformerEncoderLayer(16, 2, 32, 0.0, spec=scheme, norm_first=True).eval()
    x = torch.randn(3, L, 16)
    with torch.no_grad():
        torch.testing.assert_close(layer(x, padding), layer(x, padding, query_padding_mask=padding))
        unmasked_queries = layer(x, padding, query_padding_mask=none)
    if scheme in QUERY_NORMALIZED:  # the padded queries then take a share of every column
        assert changed_positions(unmasked_queries[:, :5], layer(x, padding)[:, :5])


def hub_zipf(**sizes) -> ProbeDataModule:
    dm = ProbeDataModule("hub", {"num_pairs": 6, "num_queries": 4, "key_vocab": 8,
                                 "value_vocab": 8, "popularity": "zipf", "ask_every_key": True},
                         **{"n_train": 64, "n_val": 32, "n_test": 32, "batch_size": 16,
                            "data_seed": 0, "seed": None, "test_options": None, **sizes})
    dm.setup()
    return dm


@pytest.mark.parametrize("scheme", SCHEMES)
def test_padding_with_roles_stays_finite_and_unread(scheme, one_thread):
    """Hub key, zipf with ask_every_key: rows padded at the end, query_only columns and padded
    rows with no valid entry; logits and gradients finite; neither a padded position's token
    (the shift on, as the probes run) nor whatever the padded positions carry into the layers
    changes anything at the other positions."""
    dm = hub_zipf()
    data = dm.splits["train"].fields
    assert data["padding_mask"].any() and (~data["padding_mask"]).all(1).sum() < 64
    torch.manual_seed(0)
    net = ProbeEncoder(8, data["inputs"].shape[1], vocab_size=dm.data.vocab_size, attention=scheme,
                       d_model=16, nhead=2, num_layers=2, dim_feedforward=32, positions="learned")
    args = (data["padding_mask"], data["key_only"], data["query_only"])
    logits = net(data["inputs"], *args)
    assert torch.isfinite(logits).all()
    logits[~data["padding_mask"]].logsumexp(-1).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)
    net.eval()  # CODA's logit noise off
    padded = data["padding_mask"]
    with torch.no_grad():
        base = net(data["inputs"], *args)
        other = net(torch.where(padded, 3, data["inputs"]), *args)
        torch.testing.assert_close(other[~padded], base[~padded], atol=0, rtol=0)

        def garbage(module, inputs):  # whatever the padded positions carry into the layers
            x, *rest = inputs
            return (torch.where(padded[..., None], 1e3 * torch.randn_like(x), x), *rest)

        hook = net.layers[0].register_forward_pre_hook(garbage)
        try:
            scrambled = net(data["inputs"], *args)
        finally:
            hook.remove()
    torch.testing.assert_close(scrambled[~padded], base[~padded], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- the module
def module_for(dm: ProbeDataModule, scheme: str = "unas", layers: int = 1,
               lr: float = 3e-3) -> ProbeModule:
    kw = dm.model_kwargs()
    torch.manual_seed(0)
    net = ProbeEncoder(kw["num_classes"], kw["seq_len"], kw["vocab_size"], kw["input_dim"],
                       attention=scheme, d_model=16, nhead=2, num_layers=layers,
                       dim_feedforward=32, positions="learned")
    return ProbeModule(net, partial(torch.optim.AdamW, lr=lr), target_kind=kw["target_kind"],
                       baselines=kw["baselines"], baseline_name=kw["baseline_name"],
                       shortcuts=kw["shortcuts"])


def unmatched(**sizes) -> ProbeDataModule:
    dm = ProbeDataModule("unmatched", {"num_objects": 3, "object_vocab": 8, "num_colours": 4},
                         **{"n_train": 64, "n_val": 48, "n_test": 40, "batch_size": 16,
                            "data_seed": 0, "seed": None, "test_options": None, **sizes})
    dm.setup()
    return dm


def trainer(**kw) -> pl.Trainer:
    return pl.Trainer(**{"logger": False, "enable_progress_bar": False,
                         "enable_model_summary": False, "enable_checkpointing": False,
                         "num_sanity_val_steps": 0, **kw})


def by_hand_cross_entropy(logits: torch.Tensor, where: list[tuple[int, int]],
                          labels: list[int]) -> torch.Tensor:
    """The mean of -log softmax(logits[b, i])[label] over the given positions, one at a time."""
    terms = [-torch.log_softmax(logits[b, i].double(), -1)[y] for (b, i), y in zip(where, labels)]
    return torch.stack(terms).mean()


@pytest.mark.parametrize("make", [unmatched, hub_zipf], ids=["unmatched", "hub_zipf"])
def test_auxiliary_targets_enter_the_training_loss(make, one_thread):
    """task_loss = the main answers' cross-entropy + the auxiliary answers' cross-entropy (each
    a mean over its own answers), computed here position by position."""
    dm = make()
    module = module_for(dm)
    batch = next(iter(dm.train_dataloader()))
    aux, targets = batch["aux_targets"], batch["targets"]
    assert (aux != IGNORE).any()
    with torch.no_grad():
        logits = module.logits(batch)
        with pytest.warns(match="self.log"):  # no trainer: logging is skipped
            loss = module.task_loss(batch, 0)
    if targets.dim() == 1:  # a sequence answer at position 0
        main = by_hand_cross_entropy(logits, [(b, 0) for b in range(len(targets))],
                                     targets.tolist())
    else:
        asked = (targets != IGNORE).nonzero().tolist()
        main = by_hand_cross_entropy(logits, asked, [int(targets[b, i]) for b, i in asked])
    extra = (aux != IGNORE).nonzero().tolist()
    auxiliary = by_hand_cross_entropy(logits, extra, [int(aux[b, i]) for b, i in extra])
    assert float(loss) == pytest.approx(float(main + auxiliary), rel=1e-5)
    assert float(auxiliary) > 0.1  # not a vanishing term that any sum would match


@pytest.mark.parametrize("make", [unmatched, hub_zipf], ids=["unmatched", "hub_zipf"])
def test_auxiliary_targets_are_never_scored(make, one_thread):
    """val/acc, val/seq_acc and val/answers count the main answers only: the same numbers with
    the auxiliary targets in the batch as without them, and the answers are the asked targets."""
    dm = make()
    module = module_for(dm)
    run = trainer()
    run.validate(module, dm.val_dataloader(), verbose=False)
    with_aux = {k: float(v) for k, v in run.callback_metrics.items()}
    split = dm.splits["val"]
    targets = split.fields["targets"]
    asked = len(targets) if targets.dim() == 1 else int((targets != IGNORE).sum())
    assert with_aux["val/answers"] == asked
    with torch.no_grad():
        logits = module.logits(split.fields)
    aux = split.fields["aux_targets"]
    if targets.dim() == 1:
        right = logits[:, 0].argmax(-1) == targets
    else:
        right = logits[targets != IGNORE].argmax(-1) == targets[targets != IGNORE]
    assert with_aux["val/acc"] == pytest.approx(float(right.double().mean()), abs=1e-6)
    # the auxiliary positions would score differently: a module that scored them would differ
    aux_right = logits[aux != IGNORE].argmax(-1) == aux[aux != IGNORE]
    both = torch.cat([right, aux_right]).double().mean()
    assert float(both) != pytest.approx(with_aux["val/acc"], abs=1e-6)
    del split.fields["aux_targets"]
    run = trainer()
    run.validate(module, dm.val_dataloader(), verbose=False)
    for key in ("val/acc", "val/seq_acc", "val/answers", "val/loss"):
        assert float(run.callback_metrics[key]) == pytest.approx(with_aux[key], abs=1e-9), key


def test_acc_auc_is_the_mean_of_the_validations_and_survives_a_checkpoint(tmp_path, one_thread):
    """Over a 3-epoch fit, val/acc_auc after each validation is the mean of val/acc so far (the
    CSV logger's history); a fit resumed from the epoch-3 checkpoint for a 4th epoch averages
    all four, and a fresh module loading the checkpoint gets the curve back."""
    dm = unmatched(n_val=64)
    module = module_for(dm, lr=3e-2)
    first = trainer(max_epochs=3, logger=CSVLogger(tmp_path, name="a", version=0))
    first.fit(module, dm)
    first.save_checkpoint(tmp_path / "last.ckpt")
    history = read_csv(tmp_path / "a" / "version_0" / "metrics.csv")
    accs = [float(r["val/acc"]) for r in history if r.get("val/acc")]
    aucs = [float(r["val/acc_auc"]) for r in history if r.get("val/acc_auc")]
    assert len(accs) == len(aucs) == 3
    assert len(set(accs)) > 1  # the curve moves, so that its mean is not any one of its points
    assert aucs == pytest.approx([sum(accs[:t]) / t for t in (1, 2, 3)], abs=1e-6)
    assert module.curve == pytest.approx(accs, abs=1e-6)

    resumed = module_for(dm, lr=3e-2)
    second = trainer(max_epochs=4, logger=CSVLogger(tmp_path, name="b", version=0))
    second.fit(resumed, dm, ckpt_path=tmp_path / "last.ckpt", weights_only=False)
    fourth = [float(r["val/acc"]) for r in read_csv(tmp_path / "b" / "version_0" / "metrics.csv")
              if r.get("val/acc")]
    assert len(fourth) == 1 and len(resumed.curve) == 4
    assert float(second.callback_metrics["val/acc_auc"]) == pytest.approx(
        sum(accs + fourth) / 4, abs=1e-6)

    fresh = module_for(dm)
    assert fresh.curve == []
    fresh.on_load_checkpoint(torch.load(tmp_path / "last.ckpt", weights_only=False))
    assert fresh.curve == pytest.approx(accs, abs=1e-6)


def test_a_validation_outside_training_leaves_the_learning_curve_alone(one_thread):
    """eval.py split=val and the head-importance callback (which validates a shallow copy of
    the module, sharing its curve, once per head) run validations of their own: they log the
    fit's val/acc_auc and add no point to its curve."""
    dm = unmatched(n_val=64)
    module = module_for(dm, lr=3e-2)
    trainer(max_epochs=2).fit(module, dm)
    fitted = list(module.curve)
    assert len(fitted) == 2
    for view in (module, copy.copy(module)):
        run = trainer()
        run.validate(view, dm.val_dataloader(), verbose=False)
        assert module.curve == fitted
        assert float(run.callback_metrics["val/acc_auc"]) == pytest.approx(sum(fitted) / 2,
                                                                           abs=1e-6)


def read_csv(path) -> list[dict]:
    import csv

    with open(path) as f:
        return list(csv.DictReader(f))


# ----------------------------------------------------------------------------- collisions
def brute_force_collisions(weights: torch.Tensor, slots: torch.Tensor) -> list[bool]:
    out = []
    for b in range(weights.shape[0]):
        read = [int(slots[b, int(weights[b, h, 0].argmax())]) for h in range(weights.shape[1])]
        out.append(any(read[h] >= 0 and read[h] == read[g]
                       for h in range(len(read)) for g in range(h + 1, len(read))))
    return out


@pytest.mark.parametrize("heads", [1, 2, 3, 4])
def test_collisions_match_a_brute_force_count(heads, one_thread):
    generator = torch.Generator().manual_seed(heads)
    weights = torch.rand(200, heads, 5, 7, generator=generator).softmax(-1)
    slots = torch.randint(-1, 3, (200, 7), generator=generator)
    expected = brute_force_collisions(weights, slots)
    assert collisions(weights, slots).tolist() == expected
    if heads > 1:
        assert 0 < sum(expected) < 200  # both outcomes occur
    # only position 0's row counts: the other rows may say anything
    scrambled = weights.clone()
    scrambled[:, :, 1:] = weights[:, :, 1:].flip(-1)
    assert collisions(scrambled, slots).tolist() == expected


def head_slots(**sizes) -> ProbeDataModule:
    dm = ProbeDataModule("retrieval", {"seq_len": 12, "num_slots": 2, "num_values": 3,
                                       "num_filler": 4, "num_value_distractors": 1},
                         **{"n_train": 32, "n_val": 32, "n_test": 40, "eval_batch_size": 16,
                            "data_seed": 0, "batch_size": 64, "seed": None, "test_options": None,
                            **sizes})
    dm.setup()
    return dm


def test_collision_rate_is_logged_for_slotted_probes_only(one_thread):
    """head slots: test/collision_rate is the share of test sequences (over several batches)
    whose first layer's heads collide, counted by brute force on the recorded weights; a probe
    without slots logs none."""
    dm = head_slots()
    module = module_for(dm, layers=2)
    run = trainer()
    run.test(module, dm.test_dataloader(), verbose=False)
    split = dm.splits["test"].fields
    with torch.no_grad(), record_attention(module.net) as recorder:
        module.logits(split)
    first = recorder.records["layers.0.self_attn"].weights
    expected = brute_force_collisions(first, split["slots"])
    assert 0 < sum(expected) < len(expected)
    assert float(run.callback_metrics["test/collision_rate"]) == pytest.approx(
        sum(expected) / len(expected), abs=1e-9)

    plain = unmatched()
    run = trainer()
    run.test(module_for(plain), plain.test_dataloader(), verbose=False)
    assert "test/collision_rate" not in run.callback_metrics
    assert "test/acc" in run.callback_metrics


# ----------------------------------------------------------------------------- shortcuts
def plurality_by_hand(values: list[int]) -> int:
    counts = Counter(values)
    top = max(counts.values())
    return min(v for v, c in counts.items() if c == top)


def test_unmatched_shortcut_is_the_b_lists_plurality_colour_per_split(one_thread):
    """shortcut_acc of each split: the plurality colour of the B list (ties: the smallest),
    read off the split's tokens here, scored against the split's targets; and the module logs
    those values as val/ and test/shortcut_acc."""
    dm = unmatched()
    b_start, colour0 = dm.data.meta["b_start"], dm.data.meta["colours"][0]
    for split in ("val", "test"):
        fields = dm.splits[split].fields
        hits = [plurality_by_hand([t - colour0 for t in row[b_start + 1::2]]) == target
                for row, target in zip(fields["inputs"].tolist(), fields["targets"].tolist())]
        assert dm.shortcuts[split] == pytest.approx(sum(hits) / len(hits))
    assert dm.shortcuts["val"] != dm.shortcuts["test"]  # per split, not one number for all rows
    module = module_for(dm)
    run = trainer()
    run.validate(module, dm.val_dataloader(), verbose=False)
    assert float(run.callback_metrics["val/shortcut_acc"]) == pytest.approx(dm.shortcuts["val"])
    run.test(module, dm.test_dataloader(), verbose=False)
    assert float(run.callback_metrics["test/shortcut_acc"]) == pytest.approx(dm.shortcuts["test"])


def test_hub_shortcut_is_the_contexts_plurality_value_at_the_scored_queries(one_thread):
    """A token-level rule: the context's plurality value, scored at the asked queries only (the
    auxiliary queries and the padding do not count)."""
    dm = hub_zipf()
    value0 = dm.data.meta["value_range"][0]
    context = dm.data.meta["context_length"]
    for split in ("val", "test"):
        fields = dm.splits[split].fields
        right = asked = 0
        for row, targets in zip(fields["inputs"].tolist(), fields["targets"].tolist()):
            guess = plurality_by_hand([t - value0 for t in row[1:context:2]])
            scored = [t for t in targets if t != IGNORE]
            right += sum(t == guess for t in scored)
            asked += len(scored)
        assert dm.shortcuts[split] == pytest.approx(right / asked)


def test_clusters_shortcut_is_fitted_on_the_training_rows_only(monkeypatch):
    """The linear classifier sees the training rows' features and targets and nothing else; its
    score on each split equals one fitted by hand on the training slice."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline, make_pipeline
    from sklearn.preprocessing import StandardScaler

    fitted = []
    fit = Pipeline.fit
    monkeypatch.setattr(Pipeline, "fit", lambda self, x, y, **kw: (fitted.append((x, y)),
                                                                  fit(self, x, y, **kw))[1])
    sizes = {"n_train": 60, "n_val": 200, "n_test": 100, "data_seed": 0, "batch_size": 64,
             "seed": None, "test_options": None}
    options = {"num_points": 16, "min_clusters": 2, "max_clusters": 4}
    dm = ProbeDataModule("clusters", options, **sizes)
    dm.setup()
    features, targets = dm.data.shortcut_features.double().numpy(), dm.data.targets.numpy()
    assert len(fitted) == 2  # once per evaluation split, each time on the same rows
    for x, y in fitted:
        assert x.shape[0] == 60 and (x == features[:60]).all() and (y == targets[:60]).all()
    by_hand = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    by_hand.fit(features[:60], targets[:60])
    for split, rows in (("val", slice(60, 260)), ("test", slice(260, 360))):
        assert dm.shortcuts[split] == pytest.approx(
            float((by_hand.predict(features[rows]) == targets[rows]).mean()))
    assert 0.2 < dm.shortcuts["val"] < 1  # neither nothing nor everything


# ----------------------------------------------------------------------------- answers
@pytest.mark.parametrize("make, expected", [
    (unmatched, lambda t: len(t)),  # one answer per sequence
    (hub_zipf, lambda t: int((t != IGNORE).sum())),  # the scored queries
])
def test_test_answers_counts_the_asked_answers_of_the_test_split(make, expected, one_thread):
    dm = make(eval_batch_size=16)  # several evaluation batches, summed
    run = trainer()
    run.test(module_for(dm), dm.test_dataloader(), verbose=False)
    targets = dm.splits["test"].fields["targets"]
    assert float(run.callback_metrics["test/answers"]) == expected(targets)
    assert expected(targets) > 40 or targets.dim() == 1


def test_target_mass_is_the_weight_on_the_entry_by_a_loop():
    from tasks.probe.module import target_mass

    g = torch.Generator().manual_seed(0)
    weights = torch.rand(3, 2, 6, 6, generator=g).softmax(-1)
    read_at = torch.full((3, 6), -1)
    read_at[0, 0], read_at[1, 4], read_at[1, 5], read_at[2, 2] = 3, 0, 5, 1
    expected = []
    for b in range(3):
        for q in range(6):
            k = int(read_at[b, q])
            if k < 0:
                continue
            heads = [float(weights[b, h, q, k] + (weights[b, h, q, k + 1] if k + 1 < 6 else 0))
                     for h in range(2)]
            expected.append(sum(heads) / 2)
    assert torch.allclose(target_mass(weights, read_at), torch.tensor(expected), atol=1e-6)
