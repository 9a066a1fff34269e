"""Tokenizers: text <-> int32 id arrays with one small interface, saved beside a run and loaded back by kind.

Every tokenizer follows the T5 id layout for its special ids: pad 0, EOS 1, unk 2 (`HFTokenizer` takes whatever
its wrapped tokenizer uses). `encode` appends EOS; `decode` stops at the first EOS and skips pad, so model outputs
decode without post-processing.

Kinds:
- `ByteTokenizer` ("byte"): ByT5-style UTF-8 bytes, id = byte + 3. Needs no files; exact round trip for any text.
- `SubwordTokenizer` ("subword"): byte-level BPE trained on the task texts with `train_subword_tokenizer`; exact
  round trip (spacing included) for any text not spelling "<pad>" or "</s>", 3-4x shorter sequences than bytes on
  the task formats.
- `HFTokenizer` ("hf"): wraps a `transformers` tokenizer (e.g. T5 SentencePiece). Round trips are only as exact as
  that tokenizer (T5's collapses repeated spaces and maps some symbols to unk).

`vocab_size` is always the real number of ids a tokenizer can emit. Models round it up (`padded_vocab_size`) for
TPU/GPU-friendly embedding shapes; `decode` drops ids outside `[0, vocab_size)`, which such a model may emit.

`Tokenizer.save(directory)` writes `refiner_tokenizer.json` (the kind and options) plus the kind's own files;
`load_tokenizer` reads back any of them, or takes a spec: "byte" or "hf:<hub name or local path>".
"""
from __future__ import annotations

import abc
import json
import os
import pathlib
import re
from typing import Any, ClassVar, Iterable, Sequence

import numpy as np

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
PAD_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "</s>", "<unk>"
KIND_FILE = "refiner_tokenizer.json"
SUBWORD_FILE = "tokenizer.json"
FORMAT_VERSION = 1

# Files that mark a directory as a `transformers` tokenizer (loaded as "hf" when it has no KIND_FILE).
_HF_MARKERS = ("tokenizer.json", "tokenizer_config.json", "spiece.model")
# A hub repository id ("t5-small", "google/t5-v1_1-base"); anything else that is not a directory is a missing path.
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
# Subword pre-tokenization: a word is a non-space run with at most one leading space; other whitespace runs stay
# separate chunks but leave their last space to the next word (so "a  b" -> "a", " ", " b"). Chunks keep
# punctuation ("number0,", "#0:") together, which lets BPE learn the task's formula tokens whole.
_SUBWORD_SPLIT = r" ?\S+|\s+(?!\S)|\s+"
# The same with punctuation split from words and numbers ("number0," -> "number0", ","; "#0," -> "#0", ","): a
# placeholder is then one token wherever it stands, in the question and in the formula. A step label "#0:" stays
# whole.
_SUBWORD_SPLIT_PUNCTUATION = r" ?#\d+:?| ?\w+| ?[^\s\w]+|\s+(?!\S)|\s+"


def padded_vocab_size(vocab_size: int, multiple: int = 128) -> int:
    """`vocab_size` rounded up to a multiple of `multiple` (embedding tables shaped for the accelerator)."""
    if vocab_size < 1 or multiple < 1:
        raise ValueError(f"vocab_size and multiple must be positive, got {vocab_size} and {multiple}")
    return -(-vocab_size // multiple) * multiple


def _padded_length(longest: int, max_len: int, pad_to: int | Sequence[int] | None) -> int:
    """Batch length: the longest row, rounded up to a multiple of `pad_to` (int) or to the smallest bucket that fits
    (sequence of lengths), never above `max_len` and never below 1."""
    if pad_to is None:
        length = longest
    elif isinstance(pad_to, (int, np.integer)):
        if pad_to < 1:
            raise ValueError(f"pad_to must be >= 1, got {pad_to}")
        length = -(-longest // int(pad_to)) * int(pad_to)
    else:
        fitting = [int(b) for b in pad_to if int(b) >= longest]
        length = min(fitting) if fitting else max_len
    return max(1, min(length, max_len))


class Tokenizer(abc.ABC):
    """Shared interface: subclasses only map text <-> ids without special ids and write their own files."""

    kind: ClassVar[str]
    pad_id: int
    eos_id: int
    vocab_size: int

    @abc.abstractmethod
    def _encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of each text, without EOS."""

    @abc.abstractmethod
    def _decode_ids(self, ids: list[int]) -> str:
        """Text of ids that contain no pad and no EOS."""

    @abc.abstractmethod
    def _save_files(self, directory: pathlib.Path) -> dict[str, Any]:
        """Write the kind's own files into `directory`; return the options `load_tokenizer` needs."""

    def encode(self, text: str, add_eos: bool = True) -> list[int]:
        """Ids of `text`, followed by EOS unless `add_eos=False`."""
        ids = self._encode_many([text])[0]
        return ids + [self.eos_id] if add_eos else ids

    def encode_batch(
        self,
        texts: Sequence[str],
        max_len: int,
        pad_to: int | Sequence[int] | None = None,
        add_eos: bool = True,
    ) -> np.ndarray:
        """int32 `[batch, len]` ids, right-padded with `pad_id`.

        Rows longer than `max_len` are truncated and keep EOS as their last id. `len` is the longest row, rounded up
        to a multiple of `pad_to` (int) or to the smallest of the bucket lengths `pad_to` (sequence) that fits, and
        capped at `max_len`; this keeps the number of distinct compiled shapes small.
        """
        if isinstance(texts, str):
            raise TypeError("encode_batch takes a sequence of strings; use encode() for a single string")
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        rows = []
        for ids in self._encode_many(list(texts)):
            if add_eos:
                ids = ids[: max_len - 1] + [self.eos_id]
            rows.append(ids[:max_len])
        length = _padded_length(max((len(r) for r in rows), default=0), max_len, pad_to)
        out = np.full((len(rows), length), self.pad_id, dtype=np.int32)  # [batch, len]
        for i, ids in enumerate(rows):
            out[i, : len(ids)] = ids
        return out

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of `ids` up to the first EOS, skipping pad and ids outside `[0, vocab_size)`."""
        kept = []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i == self.eos_id:
                break
            if i != self.pad_id and 0 <= i < self.vocab_size:
                kept.append(int(i))
        return self._decode_ids(kept)

    def decode_batch(self, array: Sequence[Sequence[int]] | np.ndarray) -> list[str]:
        """`decode` of each row of a `[batch, len]` array."""
        rows = np.asarray(array)
        if rows.ndim != 2:
            raise ValueError(f"decode_batch expects a [batch, len] array, got shape {rows.shape}")
        return [self.decode(row) for row in rows]

    def save(self, directory: str | os.PathLike) -> pathlib.Path:
        """Write this tokenizer into `directory` (created if needed) so `load_tokenizer(directory)` restores it."""
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        options = self._save_files(directory)
        meta = {
            "kind": self.kind,
            "format_version": FORMAT_VERSION,
            "vocab_size": self.vocab_size,
            "pad_id": self.pad_id,
            "eos_id": self.eos_id,
            "options": options,
        }
        (directory / KIND_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return directory


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids (ByT5 layout): 0 pad, 1 EOS, 2 unk, byte b -> b + 3; `vocab_size` 259.

    `errors` is how `decode` treats byte sequences that are not valid UTF-8 (a model can emit them): "replace"
    (default) shows them as U+FFFD so a malformed output never silently equals a reference; "ignore" drops them,
    as HF's ByT5 tokenizer does. Ids 0-2 and those >= 259 carry no byte and decode to nothing.
    """

    kind = "byte"
    offset = 3

    def __init__(self, errors: str = "replace"):
        if errors not in ("replace", "ignore", "strict"):
            raise ValueError(f"errors must be 'replace', 'ignore' or 'strict', got {errors!r}")
        self.errors = errors
        self.pad_id, self.eos_id = PAD_ID, EOS_ID
        self.vocab_size = 256 + self.offset

    def _encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        return [[b + self.offset for b in t.encode("utf-8")] for t in texts]

    def _decode_ids(self, ids: list[int]) -> str:
        data = bytes(i - self.offset for i in ids if i >= self.offset)
        return data.decode("utf-8", errors=self.errors)

    def _save_files(self, directory: pathlib.Path) -> dict[str, Any]:
        return {"errors": self.errors}


class SubwordTokenizer(Tokenizer):
    """A byte-level BPE `tokenizers.Tokenizer` with <pad>=0, </s>=1, <unk>=2 (see `train_subword_tokenizer`).

    Every byte is in the vocabulary, so any text encodes without unk and decodes back exactly. Special tokens are
    matched whole in the input (as T5's tokenizer does): extras such as "<|SIT|>" decode verbatim, while a text that
    spells "<pad>" or "</s>" gets those ids, which `decode` skips or stops at.
    """

    kind = "subword"

    def __init__(self, tokenizer: Any, source: str = "<in memory>"):
        for token, expected in ((PAD_TOKEN, PAD_ID), (EOS_TOKEN, EOS_ID), (UNK_TOKEN, UNK_ID)):
            if tokenizer.token_to_id(token) != expected:
                raise ValueError(
                    f"subword tokenizer {source} must have {token} at id {expected}, got "
                    f"{tokenizer.token_to_id(token)}; train it with train_subword_tokenizer"
                )
        self._tok = tokenizer
        self.pad_id, self.eos_id = PAD_ID, EOS_ID
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> SubwordTokenizer:
        """Load a `tokenizer.json` written by `save` (or `tokenizers.Tokenizer.save`)."""
        from tokenizers import Tokenizer as RawTokenizer

        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"subword tokenizer file {path} not found; re-create it with "
                f"train_subword_tokenizer(texts, vocab_size, directory={str(path.parent)!r})"
            )
        try:
            raw = RawTokenizer.from_file(str(path))
        except Exception as e:  # the Rust loader raises a bare Exception on malformed JSON
            raise ValueError(
                f"{path} is not a valid tokenizers JSON file ({e}); re-create it with train_subword_tokenizer"
            ) from e
        return cls(raw, source=str(path))

    @property
    def special_tokens(self) -> list[str]:
        """Tokens matched whole in the input (<pad>, </s>, <unk> and any extras), in id order."""
        added = self._tok.get_added_tokens_decoder()
        return [added[i].content for i in sorted(added) if added[i].special]

    def _encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def _decode_ids(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def _save_files(self, directory: pathlib.Path) -> dict[str, Any]:
        self._tok.save(str(directory / SUBWORD_FILE))
        return {"file": SUBWORD_FILE}


def train_subword_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    directory: str | os.PathLike | None = None,
    *,
    extra_special_tokens: Sequence[str] = (),
    min_frequency: int = 2,
    split_punctuation: bool = False,
) -> SubwordTokenizer:
    """Train a byte-level BPE tokenizer on `texts`; save it into `directory` when given.

    Ids: <pad>=0, </s>=1, <unk>=2, then `extra_special_tokens` (kept atomic, e.g. "<|SIT|>", "<|M_ACT|>"), then the
    256 byte symbols and the learned merges. Words are split off with their single leading space and their
    punctuation, so "number0," or " Answer:" can become one token, and decoding restores every space exactly.
    `vocab_size` is an upper bound (a small corpus may give fewer merges); the result's `vocab_size` is the real
    size, unpadded: pad it in the model config (`padded_vocab_size`). `split_punctuation` splits punctuation from
    words and numbers first ("number0," -> "number0" + ","), so a word or placeholder is the same token everywhere.
    """
    from tokenizers import Regex
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    specials = [PAD_TOKEN, EOS_TOKEN, UNK_TOKEN]
    for token in extra_special_tokens:
        if not isinstance(token, str) or not token or token in specials:
            raise ValueError(f"extra special token {token!r} must be a new non-empty string")
        specials.append(token)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    minimum = len(specials) + len(alphabet)
    if vocab_size < minimum:
        raise ValueError(f"vocab_size={vocab_size} is below the {minimum} ids needed for the special tokens and bytes")

    raw = RawTokenizer(models.BPE(unk_token=UNK_TOKEN))
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SUBWORD_SPLIT_PUNCTUATION if split_punctuation else _SUBWORD_SPLIT),
                                 behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens(specials)
    # The trainer does not skip special tokens in the corpus; cut them out so no merges are spent on their pieces.
    cut = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
    corpus = (piece for text in texts for piece in cut.split(text) if piece)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    raw.train_from_iterator(corpus, trainer)
    tok = SubwordTokenizer(raw)
    if directory is not None:
        tok.save(directory)
    return tok


class HFTokenizer(Tokenizer):
    """A `transformers` tokenizer behind this interface; pad/EOS ids are the wrapped tokenizer's own.

    `encode` uses `add_special_tokens=False` and appends EOS itself, so T5 tokenizers give their usual ids and
    tokenizers that add BOS/CLS do not. `decode` keeps special tokens other than pad/EOS (e.g. added markers) and
    does not clean up spaces.
    """

    kind = "hf"

    def __init__(self, hf_tokenizer: Any, source: str = "<in memory>"):
        if hf_tokenizer.eos_token_id is None or hf_tokenizer.pad_token_id is None:
            raise ValueError(
                f"HF tokenizer {source} needs both an EOS and a pad token (got eos_token={hf_tokenizer.eos_token!r}, "
                f"pad_token={hf_tokenizer.pad_token!r}); set them, e.g. tok.add_special_tokens({{'pad_token': "
                "'<pad>'}), and save it again"
            )
        if hf_tokenizer.eos_token_id == hf_tokenizer.pad_token_id:
            raise ValueError(f"HF tokenizer {source} uses one id for pad and EOS; give it a separate pad token")
        self._tok = hf_tokenizer
        self.source = source
        self.pad_id = int(hf_tokenizer.pad_token_id)
        self.eos_id = int(hf_tokenizer.eos_token_id)
        self.vocab_size = len(hf_tokenizer)

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, **kwargs: Any) -> HFTokenizer:
        """`AutoTokenizer.from_pretrained` on a local directory (or a hub name, which needs network access)."""
        name = str(name_or_path)
        path = pathlib.Path(name)
        if path.is_dir():
            if not any((path / m).is_file() for m in _HF_MARKERS):
                raise FileNotFoundError(
                    f"{path} holds no transformers tokenizer (none of {', '.join(_HF_MARKERS)}); "
                    "point at the directory written by save_pretrained"
                )
        elif not _HUB_NAME.fullmatch(name) or pathlib.Path(path.parts[0]).is_dir():  # "runs/tok" is local
            raise FileNotFoundError(
                f"HF tokenizer directory {path} does not exist; pass a directory holding tokenizer.json or "
                "spiece.model (+ tokenizer_config.json), e.g. one written by save_pretrained"
            )
        from transformers import AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(name, **kwargs)
        except OSError as e:
            raise FileNotFoundError(
                f"could not load the HF tokenizer {name!r} ({e}); without network access pass a local directory "
                "holding tokenizer.json or spiece.model + tokenizer_config.json (HF_HUB_OFFLINE=1 skips the retries)"
            ) from e
        return cls(hf, source=name)

    def _encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        return [list(ids) for ids in self._tok(list(texts), add_special_tokens=False)["input_ids"]]

    def _decode_ids(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _save_files(self, directory: pathlib.Path) -> dict[str, Any]:
        self._tok.save_pretrained(str(directory))
        return {}


def _read_kind_file(path: pathlib.Path) -> dict[str, Any]:
    fix = "re-save the tokenizer with Tokenizer.save(directory) or train_subword_tokenizer(..., directory=...)"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); {fix}") from e
    if not isinstance(meta, dict) or meta.get("kind") not in _KINDS:
        kind = meta.get("kind") if isinstance(meta, dict) else None
        raise ValueError(f"{path} names tokenizer kind {kind!r}, expected one of {sorted(_KINDS)}; {fix}")
    if meta.get("format_version", FORMAT_VERSION) > FORMAT_VERSION:
        raise ValueError(f"{path} has format_version {meta['format_version']}, newer than this library reads")
    return meta


def load_tokenizer(directory_or_spec: str | os.PathLike | Tokenizer) -> Tokenizer:
    """A tokenizer from a spec or a directory.

    - a `Tokenizer`: returned as is;
    - "byte": a `ByteTokenizer` (a directory literally named "byte" must be passed as "./byte");
    - "hf:<hub name or path>": `HFTokenizer.from_pretrained`;
    - a directory written by `Tokenizer.save`: the kind named in its `refiner_tokenizer.json`;
    - a directory holding a `transformers` tokenizer (e.g. a T5 checkpoint): an `HFTokenizer`.
    """
    if isinstance(directory_or_spec, Tokenizer):
        return directory_or_spec
    spec = os.fspath(directory_or_spec)
    if spec == "byte":
        return ByteTokenizer()
    if spec.startswith("hf:"):
        return HFTokenizer.from_pretrained(spec[3:])
    directory = pathlib.Path(spec)
    usage = (
        "pass a directory written by Tokenizer.save / train_subword_tokenizer(..., directory=...), "
        "'byte', or 'hf:<name or path>'"
    )
    if not directory.exists():
        raise FileNotFoundError(f"tokenizer directory {directory} does not exist; {usage}")
    if not directory.is_dir():
        raise ValueError(f"{directory} is a file, not a tokenizer directory; {usage}")
    kind_path = directory / KIND_FILE
    if not kind_path.is_file():
        if any((directory / m).is_file() for m in _HF_MARKERS):
            return HFTokenizer.from_pretrained(directory)
        raise FileNotFoundError(f"{directory} has no {KIND_FILE} and no transformers tokenizer files; {usage}")
    meta = _read_kind_file(kind_path)
    options = meta.get("options") or {}
    tok = _KINDS[meta["kind"]](directory, options)
    if "vocab_size" in meta and meta["vocab_size"] != tok.vocab_size:
        raise ValueError(
            f"{kind_path} records vocab_size {meta['vocab_size']} but the tokenizer files in {directory} give "
            f"{tok.vocab_size}; the directory mixes files from different tokenizers, re-save it"
        )
    return tok


_KINDS = {
    "byte": lambda directory, options: ByteTokenizer(errors=options.get("errors", "replace")),
    "subword": lambda directory, options: SubwordTokenizer.from_file(directory / options.get("file", SUBWORD_FILE)),
    "hf": lambda directory, options: HFTokenizer.from_pretrained(directory),
}
