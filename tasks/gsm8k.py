"""GSM8K (Cobbe et al. 2021): grade-school math word problems, exact match on the final number."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar

from tasks.base import Example, Prompt, Task

# The 8 chain-of-thought exemplars of Wei et al. 2022 ("Chain-of-Thought Prompting Elicits Reasoning"),
# the usual fixed GSM8K shots; fixed so few-shot prompts need no train split (not available offline).
FEWSHOT_EXEMPLARS: tuple[tuple[str, str], ...] = (
    (
        "There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are "
        "done, there will be 21 trees. How many trees did the grove workers plant today?",
        "There are 15 trees originally. Then there were 21 trees after some more were planted. So there must "
        "have been 21 - 15 = 6. The answer is 6.",
    ),
    (
        "If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?",
        "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5.",
    ),
    (
        "Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in "
        "total?",
        "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After eating "
        "35, they had 74 - 35 = 39. The answer is 39.",
    ),
    (
        "Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many lollipops "
        "did Jason give to Denny?",
        "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny "
        "20 - 12 = 8. The answer is 8.",
    ),
    (
        "Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does he "
        "have now?",
        "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. "
        "5 + 4 = 9. The answer is 9.",
    ),
    (
        "There were nine computers in the server room. Five more computers were installed each day, from "
        "monday to thursday. How many computers are now in the server room?",
        "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 "
        "computers were added. 9 + 20 is 29. The answer is 29.",
    ),
    (
        "Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How many "
        "golf balls did he have at the end of wednesday?",
        "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing 2 "
        "more, he had 35 - 2 = 33 golf balls. The answer is 33.",
    ),
    (
        "Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
        "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 "
        "dollars left. 23 - 15 is 8. The answer is 8.",
    ),
)

# A number, optionally negative (a '-' glued to a preceding word or digit is a hyphen, not a sign),
# optionally with a '$', thousands commas and decimals: "-5", "$1,234.50", "3.0".
_NUMBER = re.compile(r"(?:(?<![\w)])-)?\$?\d[\d,]*(?:\.\d+)?")


def parse_number(text: str) -> Decimal | None:
    """Numeric value of one number string ("$1,234.50" -> 1234.50), or None if it is not a number."""
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return None


def extract_last_number(text: str) -> Decimal | None:
    """The last number in a model answer (the usual GSM8K 'flexible' extraction); None if there is none."""
    matches = _NUMBER.findall(text)
    return parse_number(matches[-1]) if matches else None


def gold_answer(answer: str) -> Decimal:
    """The reference number after '####' in a GSM8K answer field."""
    value = parse_number(answer.split("####")[-1])
    if value is None:
        raise ValueError(f"GSM8K answer has no number after '####': {answer[-80:]!r}")
    return value


class GSM8K(Task):
    """Zero-shot by default; ``num_fewshot`` (0..8) prepends fixed CoT exemplars as earlier chat turns."""

    name: ClassVar[str] = "gsm8k"
    hf_id: ClassVar[str] = "openai/gsm8k"
    hf_config: ClassVar[str | None] = "main"
    hf_split: ClassVar[str] = "test"
    local_file: ClassVar[str] = "gsm8k/test.jsonl"
    default_max_new_tokens: ClassVar[int] = 256

    def __init__(self, data_dir: str | None = None, limit: int | None = None, *, num_fewshot: int = 0,
                 **options: Any) -> None:
        super().__init__(data_dir, limit, **options)
        if not 0 <= num_fewshot <= len(FEWSHOT_EXEMPLARS):
            raise ValueError(f"num_fewshot must be in 0..{len(FEWSHOT_EXEMPLARS)}, got {num_fewshot}")
        self.num_fewshot = num_fewshot

    def prompt(self, ex: Example, turn: int, history: list[str]) -> Prompt:
        self._check_turn(ex, turn, history)
        messages: list[dict[str, str]] = []
        for question, answer in FEWSHOT_EXEMPLARS[: self.num_fewshot]:
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": ex.doc["question"]})
        return Prompt(messages=messages)

    def score(self, ex: Example, outputs: list[str]) -> dict[str, float]:
        predicted = extract_last_number(self._single_output(ex, outputs))
        correct = predicted is not None and predicted == gold_answer(ex.doc["answer"])
        return {"exact_match": float(correct)}
