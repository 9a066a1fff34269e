"""A trained reward model (`models.reward_model.RewardModel`) as a batched function of (prompt, solution, steps) ->
per-step P(correct so far), all steps of a solution in one forward pass; its export and loading.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Sequence

import jax
import numpy as np

from refiner_jax import checkpoint as ckpt_lib
from refiner_jax.models.language_model import LanguageModel, config_from_dict, family_of
from refiner_jax.models.reward_model import RewardModel, step_log_odds
from refiner_jax.reward import rerank
from refiner_jax.reward.batches import reward_batch
from refiner_jax.reward.labels import LabelledSolution
from refiner_jax.tasks.base import Task
from refiner_jax.tokenizers import Tokenizer


def _one_step(text: str) -> list[str]:
    return [text] if text else []


@dataclasses.dataclass
class RewardScorer:
    """A trained reward model as a batched scorer of solutions. Rows are padded to `batch_size` and tokens to the
    budgets, so scoring compiles once."""

    module: RewardModel
    params: Any
    tokenizer: Tokenizer
    input_len: int
    target_len: int
    max_steps: int
    batch_size: int = 256
    split_steps: Callable[[str], list[str]] = _one_step  # a task's `split_steps`

    def __post_init__(self):
        self._fn = jax.jit(functools.partial(step_log_odds, self.module))

    def step_scores(self, prompts: Sequence[str], texts: Sequence[str], log_odds: bool = False) -> list[np.ndarray]:
        """P(correct so far) at each step of each solution (its log-odds with `log_odds`; steps past the token
        budgets get none), the steps cut by `split_steps`."""
        out: list[np.ndarray] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = [LabelledSolution(p, t, tuple(self.split_steps(t)), ())
                     for p, t in zip(prompts[start:start + self.batch_size], texts[start:start + self.batch_size])]
            pad = [LabelledSolution("", "", (), ())] * (self.batch_size - len(chunk))
            batch = reward_batch(LanguageModel(self.module.lm.config), self.tokenizer, chunk + pad, self.input_len,
                                 self.target_len, self.max_steps)
            feed = {k: batch[k] for k in ("inputs", "targets", "tokens", "mask", "positions", "solution_mask")
                    if k in batch}
            odds = self._fn(self.params, feed)  # [batch, max_steps]
            probs = np.asarray(odds if log_odds else jax.nn.sigmoid(odds))
            for i in range(len(chunk)):
                out.append(probs[i, batch["label_mask"][i] > 0])
        return out

    def solution_scores(self, prompts: Sequence[str], texts: Sequence[str], reduction: str = "last") -> np.ndarray:
        """One score per solution (`rerank.solution_scores`); 0 for a solution with no scored step."""
        return reduce_steps(self.step_scores(prompts, texts), reduction)


def reduce_steps(steps: Sequence[np.ndarray], reduction: str = "last") -> np.ndarray:
    """One score per solution from its step scores (`rerank.solution_scores`); 0 for a solution with no scored
    step."""
    scored = [i for i, s in enumerate(steps) if len(s)]
    out = np.zeros(len(steps))
    if scored:
        out[scored] = rerank.solution_scores([steps[i] for i in scored], reduction)
    return out


def policy_step_log_probs(policy: Any, lm_config, tokenizer: Tokenizer, task: Task, input_len: int,
                          target_len: int, max_steps: int, prompts: Sequence[str], texts: Sequence[str],
                          batch_size: int = 256) -> list[np.ndarray]:
    """The policy's log-probability of each step given the problem and the steps before it: a reward model whose
    score is the policy's own log-likelihood of the solution so far (no learned head), differenced step to step."""
    module = RewardModel(LanguageModel(lm_config).module(), "scalar", (0, 0), likelihood=True)
    params = {"lm": policy, "score_kernel": np.zeros((lm_config.d_model,), np.float32),
              "score_bias": np.zeros((), np.float32), "likelihood_scale": np.ones((), np.float32)}
    scorer = RewardScorer(module, params, tokenizer, input_len, target_len, max_steps, batch_size, task.split_steps)
    return [np.diff(so_far, prepend=0.0) for so_far in scorer.step_scores(prompts, texts, log_odds=True)]


def export_metadata(module: RewardModel, kind: str, max_steps: int) -> dict:
    """What `load_reward_model` needs beside the parameters."""
    return {"model_config": dataclasses.asdict(module.lm.config), "family": family_of(module.lm.config),
            "head": module.head, "label_ids": list(module.label_ids), "likelihood": module.likelihood, "kind": kind,
            "max_steps": max_steps}


def load_reward_model(stage_dir: str, tokenizer: Tokenizer, task: Task, input_len: int, target_len: int,
                      batch_size: int = 256) -> RewardScorer:
    """The exported reward model of a finished stage (`<workdir>/orm`, `<workdir>/prm`) as a `RewardScorer` of
    `task`'s solutions."""
    export = os.path.join(stage_dir, "export")
    if not os.path.isdir(export):
        raise FileNotFoundError(f"{export} does not exist: train the reward model first "
                                "(python launch/train.py --config=configs/rm_mwp.py --workdir=...)")
    params, meta = ckpt_lib.load_params(export)
    lm = LanguageModel(config_from_dict(meta["family"], meta["model_config"])).module()
    module = RewardModel(lm, meta["head"], tuple(meta["label_ids"]), meta.get("likelihood", False))
    return RewardScorer(module, params, tokenizer, input_len, target_len, meta["max_steps"], batch_size,
                        task.split_steps)
