"""Task data through `datasets`: parquet / JSON-lines files made here from the shared raw files (read with json and
csv, independently of the task's readers) give the same examples as the task's own readers; SVAMP.json's layout,
step-label layouts and missing sources against hand-worked expectations."""
import csv
import json
import os
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from refiner_jax.runs import run_setup
from refiner_jax.tasks import DataError, data_sources, dataset_rows, get_task
from refiner_jax.tasks.mwp.formula import execute
from refiner_jax.tasks.prm800k import read_prm800k

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path_factory, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.getbasetemp() / "hf_datasets")


def _parquet(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture(scope="module")
def gsm8k_parquet(shared_data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gsm8k_parquet")
    for split in ("train", "test"):
        with open(shared_data / "gsm8k" / f"{split}.jsonl", encoding="utf-8") as f:
            _parquet(folder / f"{split}.parquet", [json.loads(line) for line in f])
    return folder


@pytest.fixture(scope="module")
def svamp_parquet(shared_data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("svamp_parquet")
    for split, name in (("train", "train"), ("test", "dev")):
        with open(shared_data / "svamp" / "mawps-asdiv-a_svamp" / f"{name}.csv", newline="", encoding="utf-8") as f:
            _parquet(folder / f"{split}.parquet", list(csv.DictReader(f)))
    return folder


def test_gsm8k_from_parquet_equals_the_jsonl_reader(shared_data, gsm8k_parquet):
    task = get_task("gsm8k")
    with open(shared_data / "gsm8k" / "test.jsonl", encoding="utf-8") as f:
        raw = [json.loads(line) for line in f]
    for split, size in (("train", 6973), ("val", 500), ("test", 1319)):
        from_parquet = task.load(split, str(gsm8k_parquet))
        assert len(from_parquet) == size
        assert from_parquet == task.load(split, str(shared_data / "gsm8k"))
    test = task.load("test", str(gsm8k_parquet))
    assert [(e.x, e.z) for e in test] == [(r["question"].strip(), r["answer"].strip()) for r in raw]
    assert test[0].y == "18"  # "#### 18", Janet's ducks


def _hub_cache(name: str, config: str, data_files: dict) -> None:
    """Writes the `datasets` cache that `load_dataset(name, config)` leaves after a download
    (`<cache>/<owner>___<name>/<config>/0.0.0/<revision>/<name>-<split>.arrow` and `dataset_info.json`), from local
    parquet files: what a user who loaded the dataset once online has on disk."""
    import datasets
    from datasets.packaged_modules.parquet.parquet import Parquet

    owner, short = name.split("/")
    cache = pathlib.Path(datasets.config.HF_DATASETS_CACHE)
    Parquet(cache_dir=str(cache), dataset_name=short, config_name=config, config_id=config,
            data_files=data_files, hash="0123abcd").download_and_prepare()
    (cache / short).rename(cache / f"{owner}___{short}")


def test_gsm8k_from_the_hub_cache_offline(shared_data, gsm8k_parquet):
    """A hub name read in offline mode (conftest) from the cache a download leaves: the same examples as the
    task's own folder, and no download attempted."""
    _hub_cache("openai/gsm8k", "main", {s: str(gsm8k_parquet / f"{s}.parquet") for s in ("train", "test")})
    task = get_task("gsm8k")
    for split in ("train", "val", "test"):
        assert task.load(split, "openai/gsm8k:main") == task.load(split, str(shared_data / "gsm8k"))
    with pytest.raises(DataError, match="openai/gsm8k:socratic: not in the hub's cache"):
        task.load("test", "openai/gsm8k:socratic")

def test_svamp_from_parquet_equals_the_csv_reader(shared_data, svamp_parquet):
    task = get_task("mwp", lowercase=True)
    folder = shared_data / "svamp" / "mawps-asdiv-a_svamp"
    for split, size in (("train", 2838), ("val", 300), ("test", 1000)):
        from_parquet = task.load(split, str(svamp_parquet))
        assert len(from_parquet) == size and from_parquet == task.load(split, str(folder))
    first = task.load("test", str(svamp_parquet))[0]  # dev.csv row 1, as the shared README gives it
    assert first.z == "#0: subtract ( number0, number1 )" and first.meta["numbers"] == [18.0, 10.0]


@pytest.mark.parametrize("config, data", [("rm_gsm8k.py", "gsm8k_parquet"), ("refiner_mwp.py:svamp", "svamp_parquet")])
def test_a_run_reads_the_same_splits_from_parquet(config, data, request):
    """The run setup's splits of a shipped config with its own folder and with the parquet folder instead."""
    import importlib.util

    folder = request.getfixturevalue(data)  # first: skips, as the fixture does, where the shared data is absent
    path, _, variant = config.partition(":")
    spec = importlib.util.spec_from_file_location("cfg", REPO / "configs" / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(variant or None)
    task = get_task(config.task.name, **dict(config.task.options))
    own = run_setup.load_splits(task, config)
    config.task.data_dir = str(folder)
    assert run_setup.load_splits(task, config) == own


def test_moral_stories_from_parquet_equals_the_actor_reader(shared_data, tmp_path):
    """REFINER's actor files as train/test parquet give the own reader's examples (train: dev less the same
    held-out slice); a story in the dataset's own fields renders into the actor layout, by hand."""
    own = shared_data / "refiner" / "moral_stories"
    for split, name in (("train", "actor_dev.json"), ("test", "actor_test.json")):
        _parquet(tmp_path / f"{split}.parquet", json.loads((own / name).read_text(encoding="utf-8")))
    task = get_task("moral_stories")
    for split in ("train", "val", "test"):
        from_parquet = task.load(split, str(tmp_path))
        assert from_parquet and from_parquet == task.load(split, str(own))
    story = {"ID": "s1", "norm": "It's good to share.", "situation": "Ann has  two apples.",
             "intention": "Ann wants a snack.", "moral_action": "Ann gives one to Bo.",
             "immoral_action": "Ann eats both.", "moral_consequence": "Bo smiles.", "label": 1}
    _parquet(tmp_path / "stories" / "train.parquet", [story] * 3)
    _parquet(tmp_path / "stories" / "test.parquet", [story, dict(story, norm=None)])
    example = get_task("moral_stories", val_size=1).load("train", str(tmp_path / "stories"))[0]
    assert (example.uid, example.x, example.z, example.y) == (
        "s1", "<|SIT|> Ann has two apples. <|INT|> Ann wants a snack. <|I_ACT|> Ann eats both. <|NRM|>",
        "It's good to share.", "Ann gives one to Bo.")
    with pytest.raises(DataError, match=r"test.parquet: row 2: field 'norm' is missing"):
        task.load("test", str(tmp_path / "stories"))


def test_snlr_from_jsonl_equals_the_srn_reader(shared_data, tmp_path):
    """REFINER's srn_*.json records as train / validation / test JSON lines give the own reader's examples."""
    own = shared_data / "refiner" / "srn"
    for split, name in (("train", "train"), ("val", "validation"), ("test", "test")):
        _jsonl(tmp_path / f"{name}.jsonl", json.loads((own / f"srn_{split}.json").read_text(encoding="utf-8")))
    task = get_task("snlr")
    for split in ("train", "val", "test"):
        from_jsonl = task.load(split, str(tmp_path))
        assert from_jsonl and from_jsonl == task.load(split, str(own))
    (tmp_path / "validation.jsonl").unlink()
    with pytest.raises(DataError, match="no data file for the validation split"):
        task.load("val", str(tmp_path))

def test_split_pairs_and_the_hub_folder_layout(tmp_path):
    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = <<{i}+1={i + 1}>>{i + 1}\n#### {i + 1}"}
            for i in range(6)]
    _jsonl(tmp_path / "mine_a.jsonl", rows[:4])
    _parquet(tmp_path / "mine_b.parquet", rows[4:])
    _parquet(tmp_path / "hub" / "data" / "train-00000-of-00001.parquet", rows[:4])
    _parquet(tmp_path / "hub" / "data" / "test-00000-of-00001.parquet", rows[4:])
    (tmp_path / "named").mkdir()
    _jsonl(tmp_path / "named" / "train_v2.jsonl", rows[:4])
    _jsonl(tmp_path / "named" / "dev.jsonl", rows[4:])  # a validation file serves as test when there is none
    _parquet(tmp_path / "named" / "older" / "test.parquet", rows[:1])  # deeper folders are not read
    task = get_task("gsm8k", val_size=1)
    for source in (f"train={tmp_path / 'mine_a.jsonl'},test={tmp_path / 'mine_b.parquet'}", str(tmp_path / "hub"),
                   str(tmp_path / "named")):
        test = task.load("test", source)
        assert [(e.uid, e.x, e.y) for e in test] == [("gsm8k-test-0", "What is 4 + 1?", "5"),
                                                      ("gsm8k-test-1", "What is 5 + 1?", "6")]
        assert len(task.load("train", source)) == 3 and len(task.load("val", source)) == 1


def test_svamp_json_layout_is_masked_and_rewritten_in_prefix(tmp_path):
    rows = [
        {"ID": "chal-1",
         "Body": "Each pack of dvds costs 76 dollars. If there is a discount of 25 dollars on each pack",
         "Question": "How much do you have to pay to buy each pack?", "Equation": "( 76.0 - 25.0 )",
         "Answer": 51.0, "Type": "Subtraction"},
        {"ID": "x-2", "Body": "Tom has 3 boxes of 4 pens and 2 more pens.", "Question": "How many pens in cents?",
         "Equation": "( ( 3.0 * 4.0 ) + 2.0 ) * 100.0", "Answer": 1400.0, "Type": "Multiplication"},
    ]
    _jsonl(tmp_path / "svamp.jsonl", rows)
    test = get_task("mwp").load("test", f"test={tmp_path / 'svamp.jsonl'}")
    assert test[0].x == ("Each pack of dvds costs number0 dollars. If there is a discount of number1 dollars on "
                         "each pack How much do you have to pay to buy each pack?")
    assert (test[0].z, test[0].meta["numbers"], test[0].y) == ("#0: subtract ( number0, number1 )", [76.0, 25.0],
                                                              "51.0")
    # 100 is not a number of the text: it stays a constant
    assert test[1].z == ("#0: multiply ( number0, number1 ) | #1: add ( #0, number2 ) | "
                         "#2: multiply ( #1, 100.0 )")
    assert execute(test[1].z, test[1].meta["numbers"]) == 1400.0


def test_svamp_json_executes_to_its_infix_equation(shared_data, tmp_path):
    with open(shared_data / "svamp" / "SVAMP.json", encoding="utf-8") as f:
        raw = json.load(f)
    _parquet(tmp_path / "test.parquet", raw)
    test = get_task("mwp").load("test", str(tmp_path))
    assert len(test) == 1000
    for example, row in zip(test, raw):  # the infix equation is only digits, operators and parentheses
        assert execute(example.z, example.meta["numbers"]) == pytest.approx(eval(row["Equation"]), rel=1e-9)


def test_step_label_layouts(tmp_path):
    shepherd = {"input": "What is 2+3*4? Step 1: 3*4 = 12. ки\nStep 2: 2+12 = 15. ки\nStep 3: The answer is 15 ки",
                "label": "What is 2+3*4? Step 1: 3*4 = 12. +\nStep 2: 2+12 = 15. -\nStep 3: The answer is 15 -",
                "task": "GSM8K"}
    bench = {"id": "gsm8k-0", "generator": "m", "problem": "What is 1+1?",
             "steps": ["1+1 = 2.", "The answer is 2."], "final_answer_correct": True, "label": -1}
    wrong = dict(bench, steps=["1+1 = 3.", "So 3."], final_answer_correct=False, label=0)
    _parquet(tmp_path / "train.parquet", [shepherd])
    _jsonl(tmp_path / "shepherd.jsonl", [shepherd])
    _parquet(tmp_path / "bench" / "gsm8k.parquet", [bench, wrong])
    s, = dataset_rows.read_step_labels(f"train={tmp_path / 'train.parquet'}")
    assert dataset_rows.read_step_labels(str(tmp_path / "shepherd.jsonl"))[0].labels == s.labels
    assert s.question == "What is 2+3*4?" and s.steps == ("Step 1: 3*4 = 12.", "Step 2: 2+12 = 15.")
    assert (s.ratings, s.labels, s.outcome) == ((1, -1), (True, False), False)
    right, bad = dataset_rows.read_step_labels(f"test={tmp_path / 'bench' / 'gsm8k.parquet'}")
    assert (right.steps, right.labels, right.outcome) == (("1+1 = 2.", "The answer is 2."), (True, True), True)
    assert (bad.steps, bad.labels, bad.outcome) == (("1+1 = 3.",), (False,), False)


def test_prm800k_rows_read_alike_from_jsonl_and_parquet(tmp_path):
    line = {"question": {"problem": "x = 2; x^2?"}, "label": {"finish_reason": "found_error", "steps": [
        {"completions": [{"text": "x^2 = 4.", "rating": 0}], "chosen_completion": 0, "human_completion": None},
        {"completions": [{"text": "So 5.", "rating": -1}], "chosen_completion": None, "human_completion": None}]}}
    _jsonl(tmp_path / "labels.jsonl", [line])
    _parquet(tmp_path / "labels.parquet", [line])
    own, = read_prm800k(tmp_path / "labels.jsonl", neutral="negative")
    via, = dataset_rows.read_step_labels(f"train={tmp_path / 'labels.parquet'}", neutral="negative")
    assert (via.steps, via.ratings, via.labels, via.outcome) == (own.steps, own.ratings, own.labels, own.outcome)
    assert own.labels == (False,) and own.steps == ("x^2 = 4.",)  # a 0 under "negative" ends the solution


def test_missing_sources_name_the_path_or_hub_name_and_the_fix(tmp_path):
    task = get_task("gsm8k")
    with pytest.raises(DataError, match="no-such-dataset.*offline.*load_dataset"):
        task.load("test", "refiner-jax-tests/no-such-dataset:main")
    with pytest.raises(DataError, match=f"{tmp_path / 'gone.parquet'}: file not found"):
        task.load("test", f"test={tmp_path / 'gone.parquet'}")
    _parquet(tmp_path / "only" / "train.parquet", [{"question": "q", "answer": "#### 1"}])
    with pytest.raises(DataError, match="no data file for the test split.*test.parquet"):
        task.load("test", str(tmp_path / "only"))
    with pytest.raises(DataError, match="split=PATH pairs"):
        data_sources.parse("train=")


def test_bad_rows_name_the_file_row_and_field(tmp_path):
    _parquet(tmp_path / "test.parquet", [{"question": "q", "answer": "#### 1"}, {"question": "q", "answer": None}])
    with pytest.raises(DataError, match=r"test.parquet: row 2: .*'answer'"):
        get_task("gsm8k").load("test", str(tmp_path))
    (tmp_path / "latin1.jsonl").write_bytes(b'{"question": "ok", "answer": "#### 1"}\n'
                                            b'{"question": "caf\xe9", "answer": "#### 1"}\n')
    with pytest.raises(DataError, match=r"latin1.jsonl:2: not UTF-8 text \(byte 0xe9"):
        get_task("gsm8k").load("test", f"test={tmp_path / 'latin1.jsonl'}")
    (tmp_path / "null.jsonl").write_text('{"question": "ok", "answer": "#### 1"}\nnull\n')
    with pytest.raises(DataError, match=r"null.jsonl:2: got a JSON NoneType"):  # pyarrow would crash on it
        get_task("gsm8k").load("test", f"test={tmp_path / 'null.jsonl'}")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match=r"broken.parquet: not readable as data files \(ArrowInvalid"):
        get_task("gsm8k").load("test", f"test={tmp_path / 'broken.parquet'}")
    _jsonl(tmp_path / "svamp.jsonl", [{"Question": "a number0", "Numbers": "1", "Equation": 5, "Answer": "1"}])
    with pytest.raises(DataError, match=r"svamp.jsonl: row 1: field 'Equation' is a int"):
        get_task("mwp").load("test", f"test={tmp_path / 'svamp.jsonl'}")


def test_every_bad_line_of_a_file_is_named_once(tmp_path):
    path = tmp_path / "test.jsonl"
    good = json.dumps({"question": "q", "answer": "#### 1"}).encode()
    path.write_bytes(b"\n".join([good, b'{"question": "q"}', good, b"caf\xe9", b"[1]", b"", good]) + b"\n")
    with pytest.raises(DataError) as info:
        get_task("gsm8k").load("test", str(tmp_path))
    lines = str(info.value).split("\n")
    assert lines[0] == f"{path}: 3 bad lines:"
    assert [line.split(": ")[0] for line in lines[1:]] == [f"{path}:2", f"{path}:4", f"{path}:5"]
    assert "field 'answer' is missing" in lines[1] and "not UTF-8 text (byte 0xe9" in lines[2]
    assert "got a JSON list" in lines[3]


def test_recorded_sources_are_absolute_paths_or_hub_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    assert data_sources.recorded("data") == str(tmp_path / "data")
    assert data_sources.recorded("openai/gsm8k:main") == "openai/gsm8k:main"
    assert data_sources.recorded("train=a.parquet,test=b.jsonl") == \
        f"train={tmp_path / 'a.parquet'},test={tmp_path / 'b.jsonl'}"
    assert data_sources.recorded("") == "" and os.path.isabs(data_sources.recorded("missing_folder"))
