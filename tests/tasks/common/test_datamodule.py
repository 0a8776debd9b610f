"""The loaders every task's datamodule shares (tasks.common.datamodule)."""

import torch

from attnlab.sampling import EpochSeededSampler
from tasks.common.datamodule import SplitsDataModule, seeded_subset


class Numbers(SplitsDataModule):
    def __init__(self, **loader_options) -> None:
        super().__init__(torch.tensor, **loader_options)
        self.data = {"train": list(range(10)), "val": list(range(5)), "test": list(range(7))}

    def split_data(self, split):
        return self.data[split]


def batches(loader):
    return [batch.tolist() for batch in loader]


def flat(loader):
    return [i for batch in loader for i in batch.tolist()]


def test_training_order_depends_on_seed_and_epoch_and_resumes_mid_epoch():
    dm = Numbers(batch_size=4, eval_batch_size=3, seed=7)
    loader = dm.train_dataloader()
    assert isinstance(loader.sampler, EpochSeededSampler) and loader.batch_size == 4
    first = batches(loader)
    assert sorted(flat(loader)) == list(range(10)) and batches(dm.train_dataloader()) == first
    loader.sampler.set_epoch(1)
    second = batches(loader)
    assert second != first and batches(Numbers(batch_size=4, seed=8).train_dataloader()) != first
    # what a checkpoint taken after the first batch of epoch 1 resumes with
    resumed = dm.train_dataloader()
    resumed.sampler.set_epoch(1)
    resumed.sampler.resume(1, 4)
    assert flat(resumed) == flat(loader)[4:]
    assert flat(resumed) == flat(loader)  # only once


def test_evaluation_keeps_the_split_order_in_eval_batches():
    dm = Numbers(batch_size=4, eval_batch_size=3, num_workers=0)
    assert batches(dm.val_dataloader()) == [[0, 1, 2], [3, 4]]
    assert batches(dm.test_dataloader()) == [[0, 1, 2], [3, 4, 5], [6]]
    assert Numbers(batch_size=4).eval_batch_size == 4  # none given: the training batch size
    assert dm.train_dataloader().persistent_workers is False


def test_seeded_subset_is_random_in_file_order_and_reproducible():
    examples = list(range(100))
    picked = seeded_subset(examples, 10, seed=3)
    assert picked == sorted(picked) and len(set(picked)) == 10 and picked != examples[:10]
    assert seeded_subset(examples, 10, seed=3) == picked != seeded_subset(examples, 10, seed=4)
    assert seeded_subset(examples, None, seed=3) == seeded_subset(examples, 500, seed=3) == examples
