"""The architecture's rule: each layer imports only from layers below it."""

import ast
from pathlib import Path

import lmpo

LAYERS = {"algos": 1, "models": 2, "envs": 3, "rollout": 4, "trainers": 5, "reports": 6, "teach": 7, "cli": 8}
ROOT = Path(lmpo.__file__).parent


def _lmpo_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "lmpo" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_every_package_is_assigned_a_layer():
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(LAYERS), f"unassigned packages: {packages - set(LAYERS)}"


def test_imports_point_downwards_only():
    violations = []
    for package, level in LAYERS.items():
        for path in (ROOT / package).rglob("*.py"):
            for target in _lmpo_imports(path):
                if target in LAYERS and target != package and LAYERS[target] >= level:
                    violations.append(f"{path.relative_to(ROOT)} imports lmpo.{target}")
    assert not violations, "\n".join(violations)


def test_algos_is_pure_tensor_math():
    banned = {"transformers", "tokenizers", "safetensors", "yaml", "json", "pathlib", "os", "open"}
    for path in (ROOT / "algos").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not {a.name.split(".")[0] for a in node.names} & banned, path
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.module.split(".")[0] not in banned, path
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "open":
                raise AssertionError(f"{path} does I/O")


def test_envs_needs_no_torch():
    """Tasks, tools, verifiers and the sandbox import without torch or transformers, so a reward
    worker or a tool process starts in milliseconds."""
    import subprocess
    import sys

    code = ("import sys, pkgutil, importlib, lmpo.envs\n"
            "for m in pkgutil.walk_packages(lmpo.envs.__path__, 'lmpo.envs.'):\n"
            "    importlib.import_module(m.name)\n"
            "heavy = sorted(n for n in ('torch', 'transformers') if n in sys.modules)\n"
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_layer_is_a_documented_package_that_imports_nothing_itself():
    """lmpo.trainers was a namespace package; its __init__ may import nothing (no cycles)."""
    for package in LAYERS:
        init = ROOT / package / "__init__.py"
        assert init.is_file(), f"lmpo/{package} has no __init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"lmpo/{package}/__init__.py has no docstring"
    tree = ast.parse((ROOT / "trainers" / "__init__.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def test_public_names_have_docstrings_and_hints():
    import inspect

    from lmpo import algos, envs, models, rollout

    names = [(models, n) for n in ("count_parameters", "is_peft_model", "is_preset", "load_model_and_tokenizer",
                                   "parameter_counts")] + [(envs, "make_task"), (rollout, "Engine")]
    from lmpo.rollout.engine import make_decoder

    for module, name in names:
        assert inspect.getdoc(getattr(module, name)), f"{module.__name__}.{name} has no docstring"
    assert inspect.getdoc(make_decoder)
    hinted = {algos.advantages_of_valid: ("estimator", "options"), models.load_model_and_tokenizer: ("return",),
              make_decoder: ("return",), rollout.run_episodes: ("renderer", "tokenizer")}
    for fn, params in hinted.items():
        annotations = fn.__annotations__
        assert all(p in annotations for p in params), f"{fn.__name__} lacks hints for {params}"
