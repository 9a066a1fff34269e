"""Imports run one way: launch -> runs -> joint -> refiner, reward -> training, models, sampling, text_model -> tasks,
and the model layer (models/, text_model, sampling) knows nothing of tasks. Read from the source's import statements
(those under `if TYPE_CHECKING:` are annotations only and never run)."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "refiner_jax"
# Layer of each top-level module or package of refiner_jax; the others (stats, sharding, checkpoint, ...) are
# utilities any layer may use.
LAYERS = {"tasks": 0, "models": 1, "sampling": 1, "training": 1, "text_model": 1, "refiner": 2, "reward": 2,
          "joint": 3, "runs": 4}
MODEL_LAYER = ("models", "sampling", "text_model")


def _imports(path: pathlib.Path) -> set[str]:
    """The top-level refiner_jax modules that `path` imports when it runs."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "refiner_jax":
            parts = node.module.split(".")
            out |= {a.name for a in node.names} if len(parts) == 1 else {parts[1]}
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("refiner_jax.")}
    return out


def test_imports_run_one_way():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        top = path.relative_to(PACKAGE).with_suffix("").parts[0]
        if top not in LAYERS:
            continue
        for name in _imports(path):
            if name in LAYERS and LAYERS[name] > LAYERS[top]:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
            if top in MODEL_LAYER and name == "tasks":
                wrong.append(f"{path.relative_to(PACKAGE)} (the model layer) imports tasks")
    assert not wrong, wrong
