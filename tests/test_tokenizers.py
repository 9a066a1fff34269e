"""Tokenizers: hand-worked byte ids, exact round trips on the task formats, padding/truncation, save/load per kind,
HF wrappers checked against the libraries that built them, and actionable errors for broken directories."""
import io
import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refiner_jax.tokenizers import (
    KIND_FILE,
    ByteTokenizer,
    HFTokenizer,
    SubwordTokenizer,
    load_tokenizer,
    padded_vocab_size,
    train_subword_tokenizer,
)

EXTRA = ("<|SIT|>", "<|INT|>", "<|I_ACT|>", "<|NRM|>", "<|M_ACT|>")

# Strings in the exact formats the tasks produce (note the two spaces before EOS in released formulas).
TASK_STRINGS = [
    "#0: subtract ( number1, #0 ) | #1: divide ( 100.0, number2 )",
    "#0: multiply ( number0, number1 ) | #1: add ( #0, number2 ) |  EOS",
    "#0: substract ( number0, number1 ) | <END>",
    "The first number in #0 is incorrect.",
    "The first number in #0 is incorrect. The operator in #1 is incorrect.",
    "x Previous Answer: z Feedback: f",
    "Bryan has number0 books . how many ? Previous Answer: #0: divide ( number0, number1 ) |  EOS Feedback: No hint",
    "<|SIT|> Brian notices a fire. <|INT|> Brian wants  to help. <|I_ACT|> He sprays  it. <|NRM|>",
    "You should help others. <|M_ACT|> Brian drags his hose next door.",
    " <hint> the operation in the position [1, 8] is incorrect. | EOH ",
    "504.0 0.25 -3.5 1e-3",
    "",
    " ",
    "  leading and trailing  ",
    "tabs\tand\nnewlines\r\n",
    "naïve café — 数学 😀",
]


def _mwp_like_texts(n: int, seed: int = 0) -> list[str]:
    """Synthetic texts in the MWP formats: formulas, feedback sentences, refinement inputs, Moral Stories lines."""
    rng = random.Random(seed)
    ops = ["add", "subtract", "multiply", "divide"]
    texts = []
    for _ in range(n):
        steps = []
        for k in range(rng.randint(1, 3)):
            args = [rng.choice([f"number{rng.randint(0, 3)}", f"#{max(k - 1, 0)}", f"{rng.randint(1, 100)}.0"])
                    for _ in range(2)]
            steps.append(f"#{k}: {rng.choice(ops)} ( {args[0]}, {args[1]} )")
        formula = " | ".join(steps) + " |  EOS"
        feedback = f"The {rng.choice(['first', 'second'])} number in #{rng.randint(0, 2)} is incorrect."
        question = "Tom has number0 apples and buys number1 more . how many apples does he have ?"
        texts += [formula, feedback, f"{question} Previous Answer: {formula} Feedback: {feedback}",
                  "<|SIT|> Tom is at home. <|INT|> Tom wants food. <|NRM|> You should eat. <|M_ACT|> Tom cooks."]
    return texts


@pytest.fixture(scope="module")
def subword():
    return train_subword_tokenizer(_mwp_like_texts(300), vocab_size=512, extra_special_tokens=EXTRA)


# ---------------------------------------------------------------- byte tokenizer


def test_byte_ids_hand_checked():
    tok = ByteTokenizer()
    assert (tok.pad_id, tok.eos_id, tok.vocab_size) == (0, 1, 259)
    assert tok.encode("a") == [100, 1]  # ord("a") = 97, + 3
    assert tok.encode("é") == [0xC3 + 3, 0xA9 + 3, 1]  # UTF-8 C3 A9
    assert tok.encode("") == [1]
    assert tok.encode("ab", add_eos=False) == [100, 101]
    assert tok.decode([100, 101, 1, 102]) == "ab"  # stops at EOS
    assert tok.decode([100, 0, 101, 0, 0]) == "ab"  # skips pad
    assert tok.decode([100, 2, 300, 101]) == "ab"  # unk and ids beyond the vocab carry no byte


def test_byte_invalid_utf8_policy():
    lone_continuation = [0x80 + 3, 100]
    assert ByteTokenizer().decode(lone_continuation) == "\ufffda"
    assert ByteTokenizer(errors="ignore").decode(lone_continuation) == "a"
    with pytest.raises(ValueError, match="errors must be"):
        ByteTokenizer(errors="surrogateescape")


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_byte_round_trip_any_text(text):
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_padded_vocab_size():
    assert padded_vocab_size(259) == 384
    assert padded_vocab_size(384) == 384
    assert padded_vocab_size(32100) == 32128
    assert padded_vocab_size(300, multiple=256) == 512


# ---------------------------------------------------------------- batching (shared by all kinds)


def test_encode_batch_truncates_keeping_eos_and_pads():
    tok = ByteTokenizer()
    out = tok.encode_batch(["ab", "abcdef"], max_len=4)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [[100, 101, 1, 0], [100, 101, 102, 1]])
    out = tok.encode_batch(["ab", "abcdef"], max_len=4, add_eos=False)
    np.testing.assert_array_equal(out, [[100, 101, 0, 0], [100, 101, 102, 103]])
    assert tok.encode_batch(["abcdef"], max_len=1).tolist() == [[1]]
    assert tok.decode_batch(tok.encode_batch(["ab", "abcdef"], max_len=4)) == ["ab", "abc"]


def test_encode_batch_pad_to_multiple_and_buckets():
    tok = ByteTokenizer()
    texts = ["abc", "a"]  # longest row: 4 ids with EOS
    assert tok.encode_batch(texts, max_len=64).shape == (2, 4)
    assert tok.encode_batch(texts, max_len=64, pad_to=8).shape == (2, 8)
    assert tok.encode_batch(["abcdefgh"], max_len=64, pad_to=8).shape == (1, 16)  # 9 ids -> 16
    assert tok.encode_batch(["abcdefgh"], max_len=12, pad_to=8).shape == (1, 12)  # capped at max_len
    assert tok.encode_batch(texts, max_len=64, pad_to=[16, 8, 32]).shape == (2, 8)  # smallest bucket that fits
    assert tok.encode_batch(["x" * 40], max_len=64, pad_to=[8, 32]).shape == (1, 64)  # no bucket fits: max_len
    assert tok.encode_batch(texts, max_len=64, pad_to=64).shape == (2, 64)  # fixed shape
    padded = tok.encode_batch(texts, max_len=64, pad_to=8)
    np.testing.assert_array_equal(padded[1], [100, 1, 0, 0, 0, 0, 0, 0])


def test_encode_batch_rejects_bad_arguments():
    tok = ByteTokenizer()
    with pytest.raises(TypeError, match="sequence of strings"):
        tok.encode_batch("abc", max_len=8)
    with pytest.raises(ValueError, match="max_len"):
        tok.encode_batch(["abc"], max_len=0)
    with pytest.raises(ValueError, match=r"\[batch, len\]"):
        tok.decode_batch(np.array([100, 1]))
    assert tok.encode_batch([], max_len=8).shape == (0, 1)


# ---------------------------------------------------------------- subword tokenizer


def test_subword_special_ids_and_atomic_extras(subword):
    assert (subword.pad_id, subword.eos_id) == (0, 1)
    assert subword.special_tokens == ["<pad>", "</s>", "<unk>", *EXTRA]
    sit, m_act = 3, 7  # <pad> </s> <unk> then the extras in order
    assert subword.encode("<|SIT|>") == [sit, 1]
    ids = subword.encode("<|SIT|>Tom<|M_ACT|>cooks", add_eos=False)
    assert ids[0] == sit and ids.count(m_act) == 1 and ids.count(sit) == 1
    assert subword.decode(ids) == "<|SIT|>Tom<|M_ACT|>cooks"
    # The specials sit whole between ordinary tokens; the text around them encodes as it would alone.
    k = ids.index(m_act)
    assert ids[1:k] == subword.encode("Tom", add_eos=False)
    assert ids[k + 1:] == subword.encode("cooks", add_eos=False)


@pytest.mark.parametrize("text", TASK_STRINGS)
def test_subword_round_trip_task_formats(subword, text):
    assert subword.decode(subword.encode(text)) == text


@settings(max_examples=200, deadline=None)
@given(st.text().filter(lambda t: "<pad>" not in t and "</s>" not in t))
def test_subword_round_trip_any_text(subword, text):
    assert subword.decode(subword.encode(text)) == text


def test_subword_reads_special_token_text_as_the_token(subword):
    ids = subword.encode("a</s>b<unk>", add_eos=False)
    assert ids.count(1) == 1 and ids[-1] == 2
    assert subword.decode(ids) == "a"  # decoding stops at the EOS spelled in the text


def test_subword_learns_formula_tokens_whole(subword):
    # Frequent task words keep their leading space and punctuation in one token.
    assert len(subword.encode(" number0,", add_eos=False)) == 1
    assert len(subword.encode(" Previous", add_eos=False)) == 1
    assert subword.vocab_size <= 512


def test_subword_can_split_punctuation_from_placeholders():
    split = train_subword_tokenizer(_mwp_like_texts(300), vocab_size=512, split_punctuation=True)
    text = "#0: add ( number0, #1 ) | Tom has number0."

    def pieces(tok):
        return [tok.decode([i]) for i in tok.encode(text, add_eos=False)]

    # A placeholder is the same token before a comma, a bracket or a full stop; "#0:" stays one step label.
    assert pieces(split)[:7] == ["#0:", " add", " (", " number0", ",", " #1", " )"]
    assert pieces(split)[-2:] == [" number0", "."]
    assert split.decode(split.encode(text)) == text
    unsplit = train_subword_tokenizer(_mwp_like_texts(300), vocab_size=512)
    assert " number0," in pieces(unsplit)


def test_subword_vocab_size_too_small():
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_subword_tokenizer(["a b"], vocab_size=100)
    with pytest.raises(ValueError, match="extra special token"):
        train_subword_tokenizer(["a b"], vocab_size=512, extra_special_tokens=["</s>"])


def test_subword_on_released_mwp_data(shared_data):
    """Trained on the MWP critique train split, exact on every val text, and far shorter than bytes."""
    def texts(split):
        rows = json.loads((shared_data / "refiner" / "mwp" / f"critique_{split}.json").read_text())
        out = []
        for r in rows:
            x = f"{r['Body']} {r['Question']}"
            out += [x, r["Linear_Formula"], f"{x} Previous Answer: {r['incorrect_formula']} Feedback: {r['hint']}"]
        return out

    tok = train_subword_tokenizer(texts("train"), vocab_size=1024)
    val = texts("val")
    ids = tok.encode_batch(val, max_len=10_000)
    assert tok.decode_batch(ids) == val
    sub_len = float((ids != tok.pad_id).sum(1).mean())
    byte_len = float(np.mean([len(t.encode("utf-8")) + 1 for t in val]))
    assert sub_len < 0.35 * byte_len, (sub_len, byte_len)


# ---------------------------------------------------------------- save / load


def test_save_load_byte_and_subword_identical(tmp_path, subword):
    texts = TASK_STRINGS
    for name, tok in (("byte", ByteTokenizer(errors="ignore")), ("subword", subword)):
        directory = tok.save(tmp_path / name)
        back = load_tokenizer(directory)
        assert type(back) is type(tok) and back.vocab_size == tok.vocab_size
        np.testing.assert_array_equal(back.encode_batch(texts, 512), tok.encode_batch(texts, 512))
        assert back.decode_batch(back.encode_batch(texts, 512)) == texts
    assert load_tokenizer(tmp_path / "byte").errors == "ignore"
    assert json.loads((tmp_path / "subword" / KIND_FILE).read_text())["kind"] == "subword"


def test_train_with_directory_saves(tmp_path):
    tok = train_subword_tokenizer(_mwp_like_texts(20), vocab_size=400, directory=tmp_path / "run" / "tok")
    back = load_tokenizer(str(tmp_path / "run" / "tok"))
    assert isinstance(back, SubwordTokenizer)
    assert back.encode(TASK_STRINGS[0]) == tok.encode(TASK_STRINGS[0])


def test_load_specs():
    assert isinstance(load_tokenizer("byte"), ByteTokenizer)
    tok = ByteTokenizer()
    assert load_tokenizer(tok) is tok


def test_missing_and_garbled_directories(tmp_path, subword):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=f"{missing}.*does not exist.*Tokenizer.save"):
        load_tokenizer(missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=f"{empty} has no {KIND_FILE}"):
        load_tokenizer(empty)
    with pytest.raises(ValueError, match="is a file"):
        load_tokenizer(ByteTokenizer().save(tmp_path / "b") / KIND_FILE)

    bad_json = tmp_path / "bad_json"
    bad_json.mkdir()
    (bad_json / KIND_FILE).write_text("{kind: byte")
    with pytest.raises(ValueError, match=f"{bad_json / KIND_FILE} is not valid JSON.*re-save"):
        load_tokenizer(bad_json)
    bad_kind = tmp_path / "bad_kind"
    bad_kind.mkdir()
    (bad_kind / KIND_FILE).write_text('{"kind": "wordpiece"}')
    with pytest.raises(ValueError, match="'wordpiece', expected one of"):
        load_tokenizer(bad_kind)

    sub = subword.save(tmp_path / "sub")
    (sub / "tokenizer.json").write_text('{"model": ')
    with pytest.raises(ValueError, match=f"{sub / 'tokenizer.json'} is not a valid tokenizers JSON"):
        load_tokenizer(sub)
    (sub / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="train_subword_tokenizer"):
        load_tokenizer(sub)

    mixed = subword.save(tmp_path / "mixed")
    meta = json.loads((mixed / KIND_FILE).read_text())
    (mixed / KIND_FILE).write_text(json.dumps({**meta, "vocab_size": meta["vocab_size"] + 1}))
    with pytest.raises(ValueError, match="records vocab_size"):
        load_tokenizer(mixed)


# ---------------------------------------------------------------- transformers tokenizers


def _word_level_dir(tmp_path, with_pad=True):
    """A transformers tokenizer built locally: whitespace-split words, vocab written by hand."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "hello": 3, "world": 4, ",": 5}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    kwargs = {"pad_token": "<pad>"} if with_pad else {}
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>", unk_token="<unk>", **kwargs)
    directory = tmp_path / ("hf_words" if with_pad else "hf_nopad")
    hf.save_pretrained(directory)
    return directory


def test_hf_tokenizer_from_local_dir(tmp_path):
    directory = _word_level_dir(tmp_path)
    tok = HFTokenizer.from_pretrained(directory)
    assert (tok.pad_id, tok.eos_id, tok.vocab_size) == (0, 1, 6)
    assert tok.encode("hello world, zz") == [3, 4, 5, 2, 1]
    out = tok.encode_batch(["hello", "world hello world"], max_len=3, pad_to=4)
    np.testing.assert_array_equal(out, [[3, 1, 0], [4, 3, 1]])
    assert tok.decode([3, 4, 1, 4]) == "hello world"
    assert tok.decode([3, 0, 0]) == "hello"

    # A bare transformers directory loads as "hf"; after Tokenizer.save it names its kind.
    assert isinstance(load_tokenizer(directory), HFTokenizer)
    saved = tok.save(tmp_path / "saved")
    back = load_tokenizer(saved)
    assert isinstance(back, HFTokenizer)
    assert json.loads((saved / KIND_FILE).read_text())["kind"] == "hf"
    texts = ["hello world", "world , hello zz", ""]
    np.testing.assert_array_equal(back.encode_batch(texts, 8), tok.encode_batch(texts, 8))
    assert isinstance(load_tokenizer(f"hf:{directory}"), HFTokenizer)


def test_hf_tokenizer_needs_pad_and_eos(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="needs both an EOS and a pad token"):
        HFTokenizer.from_pretrained(_word_level_dir(tmp_path, with_pad=False))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        HFTokenizer.from_pretrained(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="holds no transformers tokenizer"):
        HFTokenizer.from_pretrained(tmp_path)
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):  # "runs/" is local, so no hub lookup
        load_tokenizer("hf:runs/tok")


def test_hf_t5_sentencepiece_matches_sentencepiece(tmp_path):
    """A T5-style SentencePiece model (pad 0, EOS 1, unk 2) loaded through transformers gives the ids SentencePiece
    itself gives, plus EOS."""
    import sentencepiece as spm

    corpus = ["the cat sat on the mat", "number0 plus number1", "#0: add ( number0, number1 ) | EOS"] * 50
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=model, vocab_size=32, hard_vocab_limit=False,
        model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=3,
    )
    directory = tmp_path / "t5"
    directory.mkdir()
    (directory / "spiece.model").write_bytes(model.getvalue())
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer", "extra_ids": 0}))

    tok = load_tokenizer(directory)
    reference = spm.SentencePieceProcessor(model_file=str(directory / "spiece.model"))
    assert (tok.pad_id, tok.eos_id) == (0, 1)
    for text in ["the cat sat on the mat", "#0: add ( number1, number0 ) | EOS", "number0 plus  the"]:
        assert tok.encode(text) == reference.encode(text) + [1]
        # T5's SentencePiece normalisation collapses repeated spaces, so only the normalised text comes back.
        assert tok.decode(tok.encode(text)) == reference.decode(reference.encode(text))
