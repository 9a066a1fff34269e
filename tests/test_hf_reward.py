"""Public process reward models (`models.hf_reward`) against PyTorch references built locally with random weights:
a Qwen2.5-Math-PRM-shaped model (transformers' Qwen2Model plus the two-layer `score` head, saved as the hub
checkpoint lays it out) and Math-Shepherd-style causal LMs (transformers' own classes); the text scorer and the
`launch/score_prm.py` entry point end to end on a tiny tokenizer, its F1 checked by hand from the written scores."""
import json
import os
import sys

import numpy as np
import pytest
from _helpers import compilations, import_torch
from _tolerance import NETWORK, PARITY, assert_f32_close

from refiner_jax.models import hf_reward
from refiner_jax.reward import first_error
from refiner_jax.reward.scorer import load_public_prm
from refiner_jax.tasks.step_label_files import StepRecord, write_processbench, write_trl_stepwise

torch = import_torch()
transformers = pytest.importorskip("transformers")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the launch scripts
from launch import score_prm  # noqa: E402

TAG = 5  # the step tag's id in the parity tests
WORDS = (["<pad>", "<unk>", "<extra_0>", "<|im_start|>", "<|im_end|>", "ки", "+", "-", "Step", ":", "system", "user",
          "assistant", "add", "and", "is", "so", "the", "answer", "Please", "reason"] + [str(i) for i in range(10)])
CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def _qwen2_config(tied: bool = False):
    return transformers.Qwen2Config(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0})


class ReferencePRM(torch.nn.Module):
    """Qwen2.5-Math-PRM's layout: the Qwen2 stack as `model`, `score` = Linear(d, d) -> ReLU -> Linear(d, 2)."""

    def __init__(self, config):
        super().__init__()
        d = config.hidden_size
        self.model = transformers.Qwen2Model(config)
        self.score = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, 2))

    def forward(self, ids, mask):  # -> [batch, len, 2] logits
        args = dict(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long))
        return self.score(self.model(**args).last_hidden_state)


def _randomise(model, seed: int):
    """Every tensor random at a scale where the step probabilities spread over (0, 1)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.3 if p.ndim == 1 else 0.25
            p.copy_(1.0 + scale * torch.randn_like(p) if name.endswith("norm.weight") else scale * torch.randn_like(p))
    return model.eval()


def _save_prm(ref: ReferencePRM, directory) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(directory / "model.safetensors"))
    hf = dict(ref.model.config.to_dict(), architectures=["Qwen2ForProcessRewardModel"])
    (directory / "config.json").write_text(json.dumps(hf))


@pytest.fixture(scope="module")
def qwen_prm(tmp_path_factory):
    ref = _randomise(ReferencePRM(_qwen2_config()), seed=1)
    directory = tmp_path_factory.mktemp("qwen_prm")
    _save_prm(ref, directory)
    return ref, directory


def _inputs(vocab: int, lengths, seed: int = 0):
    """Right-padded random rows with the tag at a few positions of each (the last real token included)."""
    rng = np.random.default_rng(seed)
    ids, mask = np.zeros((len(lengths), max(lengths)), np.int64), np.zeros((len(lengths), max(lengths)), bool)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.choice([t for t in range(3, vocab) if t != TAG], n)
        ids[row, rng.choice(n - 1, 2, replace=False)] = TAG
        ids[row, n - 1], mask[row, :n] = TAG, True
    return ids, mask


def _check(ours, ref_probs, ref_scale, ids, mask, what):
    tags = (ids == TAG) & mask
    assert np.isnan(ours[~tags]).all(), "off the tags the score must be NaN"
    # A probability moves by at most half the error of the logits it comes from: PARITY ulps of the logits' scale.
    assert_f32_close(ours[tags], ref_probs[tags], ulps=PARITY, scale=ref_scale, what=what)
    assert np.ptp(ref_probs[tags]) > 0.2, "the weights must spread the probabilities (a misread position shows)"


def test_qwen_prm_matches_reference_and_compiles_once_per_bucket(qwen_prm):
    ref, directory = qwen_prm
    score_fn, prm = hf_reward.load_process_reward_model(directory, TAG)
    assert (prm.layout, prm.step_tag_id, prm.label_ids) == ("prm_head", TAG, None)
    with compilations() as compiled:
        for lengths in ((11, 7, 9), (12, 5, 13, 10)):  # both in the bucket of 4 rows x 16 tokens
            ids, mask = _inputs(40, lengths, seed=len(lengths))
            ours = score_fn(ids, mask)
            assert ours.shape == ids.shape and ours.dtype == np.float32
            with torch.no_grad():
                logits = ref(ids, mask)
            ref_probs = torch.softmax(logits, -1)[..., 1].numpy()
            _check(ours, ref_probs, float(logits.abs().max()), ids, mask, "qwen prm step probabilities")
    assert len(compiled) == 1


@pytest.mark.parametrize("family", ["llama", "qwen2-tied"])
def test_causal_lm_prm_matches_transformers(family, tmp_path):
    good, bad = 6, 7
    if family == "llama":
        config = transformers.LlamaConfig(
            vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    else:
        config = _qwen2_config(tied=True)
    ref = _randomise(transformers.AutoModelForCausalLM.from_config(config), seed=2)
    ref.save_pretrained(tmp_path)
    score_fn, prm = hf_reward.load_process_reward_model(tmp_path, TAG, good, bad)
    assert (prm.layout, prm.label_ids, prm.decoder.tie_embeddings) == ("causal_lm", (good, bad), family != "llama")
    ids, mask = _inputs(40, (10, 6, 14))
    with torch.no_grad():
        logits = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask, dtype=torch.long)).logits
    pair = logits[..., [good, bad]]
    _check(score_fn(ids, mask), torch.softmax(pair, -1)[..., 0].numpy(), float(pair.abs().max()), ids, mask,
           f"{family} good-token probabilities")


def test_errors_name_the_fix(qwen_prm, tmp_path):
    _, directory = qwen_prm
    with pytest.raises(ValueError, match="own two-class head; drop good_token_id"):
        hf_reward.load_process_reward_model(directory, TAG, 6, 7)
    score_fn, _ = hf_reward.load_process_reward_model(directory, TAG)
    ids, mask = _inputs(40, (6, 6))
    ids[1, ids[1] == TAG] = 9
    with pytest.raises(ValueError, match="row 1 holds no step tag"):
        score_fn(ids, mask)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        hf_reward.load_process_reward_model(directory, 40)
    hf = json.loads((directory / "config.json").read_text())
    other = tmp_path / "classifier"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(dict(hf, architectures=["Qwen2ForSequenceClassification"])))
    with pytest.raises(ValueError, match="'Qwen2ForSequenceClassification' .* is not a process reward model"):
        hf_reward.load_process_reward_model(other, TAG)
    causal = tmp_path / "causal"
    causal.mkdir()
    (causal / "config.json").write_text(json.dumps(dict(hf, architectures=["Qwen2ForCausalLM"])))
    with pytest.raises(ValueError, match="pass good_token_id and bad_token_id"):
        hf_reward.load_process_reward_model(causal, TAG)


def test_text_layouts():
    assert hf_reward.math_shepherd_text("add 2 and 3", ["2 + 3 = 5", "Step 2: so 5"]) == (
        "add 2 and 3 Step 1: 2 + 3 = 5 ки\nStep 2: so 5 ки")
    messages = hf_reward.qwen_prm_messages("add", ["a", "b"])
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[2]["content"] == "a<extra_0>b<extra_0>" and messages[1]["content"] == "add"


def _tokenizer(directory):
    """A word-level transformers tokenizer with the chat's special tokens and a ChatML-like template, in a folder
    of its own (beside a checkpoint's config.json, transformers would build that model type's tokenizer class)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", pad_token="<pad>")
    tok.add_special_tokens({"additional_special_tokens": ["<extra_0>", "<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHAT
    tok.save_pretrained(directory)
    return directory


RECORDS = [StepRecord("add 2 and 3", ("2 + 3 is 5", "so the answer is 5"), -1),
           StepRecord("add 4 and 4", ("4 + 4 is 9", "so 9"), 0),
           StepRecord("add 1 and 1", ("1 + 1 is 2", "2 + 1 is 4", "so 4"), 1),
           StepRecord("add 7 and 1", ("7 + 1 is 8",), -1),
           StepRecord("add 2 and 2", ("2 + 2 is 4", "so the answer is 4"), -1)]


def _shepherd_row(record: StepRecord) -> dict:
    text = hf_reward.math_shepherd_text(record.problem, record.steps)
    pieces = text.split("ки")  # Math-Shepherd's label: the input with + or - in place of each tag
    marks = ["+" if ok else "-" for ok in record.labels] + [""]
    return {"input": text, "label": "".join(p + m for p, m in zip(pieces, marks))}


@pytest.mark.parametrize("layout", ["processbench", "trl", "math_shepherd"])
def test_score_prm_end_to_end(layout, qwen_prm, tmp_path):
    if layout == "math_shepherd":  # a causal LM read at Math-Shepherd's tag, with '+' / '-' label tokens
        model = tmp_path / "model"
        _randomise(transformers.AutoModelForCausalLM.from_config(_qwen2_config()), seed=3).save_pretrained(model)
        source = tmp_path / "shepherd.jsonl"
        source.write_text("".join(json.dumps(_shepherd_row(r), ensure_ascii=False) + "\n" for r in RECORDS))
        labels = dict(good_token="+", bad_token="-")
    else:
        model, source, labels = qwen_prm[1], tmp_path / f"{layout}.jsonl", {}
        (write_processbench if layout == "processbench" else write_trl_stepwise)(source, RECORDS)
    output = tmp_path / "out" / "scores.jsonl"
    threshold = 0.5
    table = score_prm.score_file(str(model), str(source), str(output), tokenizer=str(_tokenizer(tmp_path / "tok")),
                                 threshold=threshold, bootstrap_samples=50, **labels)
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert json.loads((tmp_path / "out" / "scores_f1.json").read_text()) == json.loads(json.dumps(table))
    assert [r["label"] for r in rows] == [r.first_error for r in RECORDS]
    # The readers keep the steps up to the first error: one score per kept step.
    assert [len(r["step_scores"]) for r in rows] == [2, 1, 2, 1, 2]
    assert all(0 < s < 1 for r in rows for s in r["step_scores"])
    # F1 by hand from the written scores: the first step below the threshold, exact on erroneous solutions, none
    # on correct ones.
    predicted = [next((k for k, s in enumerate(r["step_scores"]) if s < threshold), -1) for r in rows]
    assert predicted == [r["prediction"] for r in rows]
    erroneous = [p == r["label"] for p, r in zip(predicted, rows) if r["label"] >= 0]
    correct = [p == -1 for p, r in zip(predicted, rows) if r["label"] < 0]
    a, b = sum(erroneous) / len(erroneous), sum(correct) / len(correct)
    assert table["acc_erroneous"]["mean"] == pytest.approx(a) and table["acc_correct"]["mean"] == pytest.approx(b)
    assert table["f1"]["mean"] == pytest.approx(2 * a * b / (a + b) if a + b else 0.0)
    assert (table["cases"], table["erroneous"], table["correct"]) == (5, 2, 3)


def test_tagged_scorer_matches_score_fn_and_reranks(qwen_prm, tmp_path):
    """The text scorer reads the probabilities at the tags of the rendered chat, each solution alone or batched
    with others alike; its solution scores are `rerank`'s reductions of them."""
    scorer = load_public_prm(qwen_prm[1], _tokenizer(tmp_path), batch_size=2,
                             split_steps=lambda text: text.split("\n"))
    problems, steps = [r.problem for r in RECORDS], [r.steps for r in RECORDS]
    batched = scorer.score_steps(problems, steps)
    tok = scorer.tokenizer
    for problem, solution, scores in zip(problems, steps, batched):
        ids = np.array([tok(tok.apply_chat_template(hf_reward.qwen_prm_messages(problem, solution),
                                                     tokenize=False))["input_ids"]])
        alone = scorer.score_fn(ids, np.ones_like(ids, bool))[0]
        # Another padded shape: the same network's roundings, on probabilities (scale 1).
        assert_f32_close(alone[ids[0] == scorer.step_tag_id], scores, ulps=NETWORK, scale=1.0, what="alone")
    texts = ["\n".join(s) for s in steps]
    np.testing.assert_allclose(scorer.solution_scores(problems, texts, "min"), [s.min() for s in batched])
    _, predicted = first_error.step_score_predictions(RECORDS, scorer.score_steps, 0.5)
    np.testing.assert_array_equal(predicted, first_error.first_below(batched, 0.5))
    with pytest.raises(ValueError, match="2 steps but 3 step tags"):
        scorer.score_steps(["add"], [("1 <extra_0> 2", "so 3")])
