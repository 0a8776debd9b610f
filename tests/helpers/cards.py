"""The tasks the tests cover, discovered from their cards (conf/task/*.yaml): nothing lists them."""

from attnlab.cards import task_cards
from helpers.paths import CONF, FIXTURES

CARDS = task_cards(CONF)
# overrides that shrink each task to seconds (tiny data, tiny model, one epoch)
TINY: dict[str, list[str]] = {name: card.tiny_overrides(FIXTURES) for name, card in CARDS.items()}
# the overrides that give each task's scheme-carrying attention >= 2 heads
MULTI_HEAD: dict[str, list[str]] = {name: list(card.multi_head) for name, card in CARDS.items()}
