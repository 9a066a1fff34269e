"""GSM8K (grade-school math word problems) as a REFINER / reward-model task.

`calculator`: exact arithmetic of the `<<expr=result>>` annotations; `answers`: final answers; `step_check`: the
step rule behind the oracle and the process labels; `gsm8k_task`: `GSM8KTask` (data, oracle feedback,
perturbations, metrics).
"""
from refiner_jax.tasks.gsm8k.answers import answers_match, extract_answer, has_answer_marker
from refiner_jax.tasks.gsm8k.calculator import (FORMAT_DECIMALS, MAX_EXPRESSION_CHARS, MAX_NESTING, CalcError,
                                                calculator_completion, evaluate_expression, format_number,
                                                parse_number)
from refiner_jax.tasks.gsm8k.gsm8k_task import SPLIT_FILES, GSM8KTask, default_data_dir, read_jsonl
from refiner_jax.tasks.gsm8k.step_check import (CONSTANTS, NUMBER_WORDS, Annotation, StepCheck, check_steps,
                                                gold_numbers, parse_annotations, question_numbers, split_solution,
                                                strip_annotations)

__all__ = [
    "CONSTANTS", "FORMAT_DECIMALS", "MAX_EXPRESSION_CHARS", "MAX_NESTING", "NUMBER_WORDS", "SPLIT_FILES",
    "Annotation", "CalcError", "GSM8KTask", "StepCheck", "answers_match", "calculator_completion", "check_steps",
    "default_data_dir", "evaluate_expression", "extract_answer", "format_number", "gold_numbers",
    "has_answer_marker", "parse_annotations", "parse_number", "question_numbers", "read_jsonl", "split_solution",
    "strip_annotations",
]
