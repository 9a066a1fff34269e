"""The sNLR task (HELM `synthetic_reasoning_natural`, hard) with REFINER's reasoning chains.

`generator`: HELM's instance generator; `records`: reading REFINER-layout records into problems; `chains`: the
gold reasoning chains; `chain_oracle`: the structural critic and its feedback; `helm_metrics`: HELM's answer
metrics; `snlr_task`: `SNLRTask` (data, oracle feedback, perturbations, step labels, metrics).
"""
from refiner_jax.tasks.snlr.chain_oracle import (ERROR_KINDS, MISSING_IMPLICIT, MISSING_LINK, Statement,
                                                 feedback_from_errors, oracle_errors, read_conclusion,
                                                 read_statement)
from refiner_jax.tasks.snlr.chains import (CHAIN_STYLES, NOTHING_STEP, Step, build_chain, build_steps,
                                           fired_applications, serialize, split_steps)
from refiner_jax.tasks.snlr.helm_metrics import helm_attribute_set, set_f1, set_iou
from refiner_jax.tasks.snlr.records import REQUIRED_KEYS, parse_record, render_x, render_y
from refiner_jax.tasks.snlr.snlr_task import SPLITS, SNLRTask

__all__ = [
    "CHAIN_STYLES", "ERROR_KINDS", "MISSING_IMPLICIT", "MISSING_LINK", "NOTHING_STEP", "REQUIRED_KEYS", "SPLITS",
    "SNLRTask", "Statement", "Step", "build_chain", "build_steps", "feedback_from_errors", "fired_applications",
    "helm_attribute_set", "oracle_errors", "parse_record", "read_conclusion", "read_statement", "render_x",
    "render_y", "serialize", "set_f1", "set_iou", "split_steps",
]
