"""The tasks the tests cover, discovered from their cards (conf/task/*.yaml): nothing lists them."""

from attnlab.cards import task_cards
from helpers.paths import CONF, FIXTURES

CARDS = task_cards(CONF)
# overrides that shrink each task to seconds (tiny data, tiny model, one epoch)
TINY: dict[str, list[str]] = {name: card.tiny_overrides(FIXTURES) for name, card in CARDS.items()}
# the overrides that give each task's scheme-carrying attention >= 2 heads
MULTI_HEAD: dict[str, list[str]] = {name: list(card.multi_head) for name, card in CARDS.items()}


def shares(items: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """{task: (items it runs in the default suite, the rest: `slow`)} for a test over every task x
    every item (scheme, model) that costs a CLI run per pair. The first task of each kind (its
    scheme in causal attention or not) runs every item; the other tasks of that kind share the
    items in turn, so that each item still runs in one of them and in every kind of task."""
    out = {}
    for causal in (False, True):
        tasks = [t for t in TINY if CARDS[t].causal == causal]
        if not tasks:
            continue
        out[tasks[0]] = (list(items), [])
        others = tasks[1:]
        for i, task in enumerate(others):
            mine = items[i::len(others)] or [items[i % len(items)]]  # more tasks than items
            out[task] = (mine, [x for x in items if x not in mine])
    return out
