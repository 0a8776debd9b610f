"""The questions of the synthetic VQA benchmark: programs run on a scene, balanced per question
string, each with ten noisy annotator answers.

A scene is a list of objects, each a dict {attribute name: value index, "primary": bool}. A
question is a small program (a tuple) that `evaluate` runs on a scene; `rng` is a random.Random.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from tasks.vqa.synthetic_scenes import ATTRIBUTE_NAMES, ATTRIBUTES

if TYPE_CHECKING:
    from tasks.vqa.synthetic import SyntheticParams

QUESTION_TYPES = ("existence", "counting", "attribute", "comparison")
NUM_ANSWERS_PER_QUESTION = 10


def _noun(filters: dict[str, int], plural: bool = False) -> str:
    words = [ATTRIBUTES[a][filters[a]] for a in ("size", "color", "material") if a in filters]
    noun = ATTRIBUTES["shape"][filters["shape"]] if "shape" in filters else "object"
    return " ".join(words + [noun + ("s" if plural else "")])


def _count(scene: list[dict], filters: dict[str, int]) -> int:
    return sum(all(obj[a] == v for a, v in filters.items()) for obj in scene)


def _filters(rng, scene, from_scene: float) -> dict[str, int]:
    """1 or 2 attributes, taken from an object of the scene with probability `from_scene`."""
    names = rng.sample(ATTRIBUTE_NAMES, rng.randint(1, 2))
    if rng.random() < from_scene:
        obj = rng.choice(scene)
        return {a: obj[a] for a in names}
    return {a: rng.randrange(len(ATTRIBUTES[a])) for a in names}


def _program(rng, qtype: str, scene: list[dict]) -> tuple | None:
    if qtype == "existence":
        return ("exist", _filters(rng, scene, 0.5))
    if qtype == "counting":
        return ("count", _filters(rng, scene, 0.75))
    if qtype == "attribute":
        asked = rng.choice(ATTRIBUTE_NAMES)
        obj = rng.choice(scene)
        names = [a for a in ATTRIBUTE_NAMES if a != asked]
        reference = {a: obj[a] for a in rng.sample(names, rng.randint(1, 2))}
        return ("query", asked, reference)
    attr = rng.choice(ATTRIBUTE_NAMES)  # comparison of two counts of one attribute
    a, b = rng.sample(range(len(ATTRIBUTES[attr])), 2)
    return (rng.choice(("more", "fewer")), {attr: a}, {attr: b})


def render(program: tuple) -> str:
    op = program[0]
    if op == "exist":
        return f"is there a {_noun(program[1])} ?"
    if op == "count":
        return f"how many {_noun(program[1], plural=True)} are there ?"
    if op == "query":
        return f"what {program[1]} is the {_noun(program[2])} ?"
    return f"are there {op} {_noun(program[1], True)} than {_noun(program[2], True)} ?"


def evaluate(program: tuple, scene: list[dict]) -> str | None:
    """The answer on `scene`; None if the question does not apply (no unique referent)."""
    op = program[0]
    if op == "exist":
        return "yes" if _count(scene, program[1]) else "no"
    if op == "count":
        return str(_count(scene, program[1]))
    if op == "query":
        matches = [o for o in scene if all(o[a] == v for a, v in program[2].items())]
        return ATTRIBUTES[program[1]][matches[0][program[1]]] if len(matches) == 1 else None
    first, second = _count(scene, program[1]), _count(scene, program[2])
    return "yes" if (first > second if op == "more" else first < second) else "no"


def ask(rng, params: SyntheticParams, scenes: list[list[dict]]) -> dict[str, list]:
    """`questions_per_image` balanced questions per image (fewer if balancing rejects too many
    candidates), the types in turn. A candidate is accepted only if its answer is at most
    `balance_slack` ahead of the rarest answer seen so far for the same question string, so that
    no question string predicts its answer."""
    tally: dict[str, Counter] = defaultdict(Counter)
    out: dict[str, list] = {
        k: [] for k in ("question", "answer", "answers", "type", "image", "hidden")
    }
    per_image = params.questions_per_image
    for i, scene in enumerate(scenes):
        visible = [o for o in scene if o["primary"]]
        for q in range(per_image):
            qtype = QUESTION_TYPES[(i * per_image + q) % len(QUESTION_TYPES)]
            for _ in range(50):
                program = _program(rng, qtype, scene)
                answer = evaluate(program, scene)
                if answer is None:
                    continue
                question = render(program)
                counts = tally[question]
                support = ("yes", "no") if answer in ("yes", "no") else set(counts) | {answer}
                if counts[answer] > min(counts[a] for a in support) + params.balance_slack - 1:
                    continue
                counts[answer] += 1
                out["question"].append(question)
                out["answer"].append(answer)
                out["answers"].extend(_annotate(rng, answer, params.annotator_noise))
                out["type"].append(qtype)
                out["image"].append(i)
                out["hidden"].append(evaluate(program, visible) != answer)
                break
    return out


_NUMBER_WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
)


def _annotate(rng, answer: str, noise: float) -> list[str]:
    """Ten annotator answers: mostly right, some wrong in plausible ways, varied spelling."""
    p_wrong = rng.uniform(0, 2 * noise)  # some questions are harder to agree on
    answers = []
    for _ in range(NUM_ANSWERS_PER_QUESTION):
        given = _wrong_answer(rng, answer) if rng.random() < p_wrong else answer
        answers.append(_spell(rng, given))
    return answers


def _wrong_answer(rng, answer: str) -> str:
    if answer in ("yes", "no"):
        return "no" if answer == "yes" else "yes"
    if answer.isdigit():
        return str(max(0, int(answer) + rng.choice((-1, 1))))
    for values in ATTRIBUTES.values():
        if answer in values:
            return rng.choice([v for v in values if v != answer])
    return answer


def _spell(rng, answer: str) -> str:
    """How an annotator might type the answer; the official normalization maps it back."""
    r = rng.random()
    if answer.isdigit() and int(answer) <= 10 and r < 0.2:
        return _NUMBER_WORDS[int(answer)]
    if answer in ("yes", "no") and r < 0.1:
        return answer.capitalize() + "."
    if answer in ATTRIBUTES["shape"] and r < 0.1:
        return "a " + answer
    return answer
