"""Math word problems (MAWPS+ASDiv-A and SVAMP, or the embedded generator) with linear formulas as hypotheses.

`formula`: the hypothesis language (parse, format, compile, execute); `oracle`: the structural critic and its
feedback; `perturbations`: the critic's training hypotheses; `svamp_data`: the csv reader; `synthetic` (with
`synthetic_domains`, `synthetic_families`): the embedded problem generator; `mwp_task`: `MWPTask`.
"""
from refiner_jax.tasks.mwp.formula import (COMMUTATIVE, OPS, Arg, Formula, ParseResult, Step, answers_match,
                                           compile_prefix, execute, format_formula, normalize_whitespace,
                                           parse_formula)
from refiner_jax.tasks.mwp.mwp_task import MWPTask
from refiner_jax.tasks.mwp.oracle import ERROR_KINDS, SENTENCES, equivalent, feedback_text, oracle_errors
from refiner_jax.tasks.mwp.perturbations import DEFAULT_PERTURBATION_WEIGHTS, PERTURBATIONS
from refiner_jax.tasks.mwp.svamp_data import heldout_split

__all__ = [
    "COMMUTATIVE", "DEFAULT_PERTURBATION_WEIGHTS", "ERROR_KINDS", "OPS", "PERTURBATIONS", "SENTENCES", "Arg",
    "Formula", "MWPTask", "ParseResult", "Step", "answers_match", "compile_prefix", "equivalent", "execute",
    "feedback_text", "format_formula", "heldout_split", "normalize_whitespace", "oracle_errors", "parse_formula",
]
