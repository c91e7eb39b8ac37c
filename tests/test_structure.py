"""The shape of the code: no import cycles, one vocabulary, small functions, documented commands.

These are the architecture's promises (shared/design/ARCHITECTURE.md), checked on every run so that
they stay true as the code grows.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "optimize"
README = PACKAGE.parent / "README.md"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _module_level_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Package modules imported at module level (imports inside functions are lazy on purpose)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in known and m != name}


def test_module_level_imports_have_no_cycle():
    mods = _modules()
    graph = {m: _module_level_imports(m, p, set(mods)) for m, p in mods.items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if n == "optimize":  # the package itself (`from . import x` resolves to x above)
                continue
            if state.get(n) == 1:
                cycle = path[path.index(n) :] + [n] if n in path else [m, n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n, [*path, n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter's layers contract (pyproject.toml) over the package under `root`."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command as m; m()",
            "--config",
            str(root / "pyproject.toml"),
            "--no-cache",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )


def test_packages_import_only_from_the_layers_below():
    """core < models < measure|delegates < convert < transforms|decide < present < engine < cli, imports inside
    functions included (pyproject.toml's contract): a lower package never reaches a higher one."""
    r = _lint_imports(PACKAGE.parent)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "1 kept, 0 broken" in r.stdout


def test_the_layer_check_fails_on_an_upward_import(tmp_path):
    """The contract is not vacuous: the same tree with one upward import (core -> engine, inside a function,
    the way a circle used to be dodged) is refused, naming both ends."""
    shutil.copytree(PACKAGE, tmp_path / "optimize", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PACKAGE.parent / "pyproject.toml", tmp_path)
    vocab = tmp_path / "optimize" / "core" / "vocab.py"
    vocab.write_text(vocab.read_text() + "\n\ndef _late():\n    from optimize.engine import sweeps  # noqa\n")
    r = _lint_imports(tmp_path)
    assert r.returncode != 0 and "BROKEN" in r.stdout
    assert "optimize.core.vocab" in r.stdout and "optimize.engine.sweeps" in r.stdout


def test_few_modules_at_the_top():
    """The pipeline shows in the tree: packages by responsibility, only the public API and the CLI at the top."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "cli.py"], top
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert packages == [
        "convert",
        "core",
        "decide",
        "delegates",
        "engine",
        "measure",
        "models",
        "present",
        "transforms",
    ]


#: The PyTorch/ONNX front door's own torch and onnx code: imported only inside functions, for a PyTorch or
#: ONNX model, with the torch extra installed (each needs that package at import time; nothing else may).
NEEDS_EXTRA = {
    "optimize.convert.onnx_ops": "torch",
    "optimize.convert.onnx_base": "torch",
    "optimize.convert.onnx_dense": "torch",
    "optimize.convert.onnx_select": "torch",
    "optimize.convert.onnx_graph": "onnx",
}


def test_every_module_imports_alone_without_tensorflow():
    """Each module, imported first in a clean interpreter state, loads (no hidden order dependence)
    and does not pay for TensorFlow, nor for torch (whether the torch extra is installed or not)."""
    import importlib.util

    names = sorted(m for m in _modules() if m != "optimize" and m not in NEEDS_EXTRA)
    names += sorted(m for m, need in NEEDS_EXTRA.items() if importlib.util.find_spec(need))  # last: they load torch
    code = (
        "import importlib, sys\n"
        f"names = {names!r}\n"
        f"extra = {sorted(NEEDS_EXTRA)!r}\n"
        "bad = []\n"
        "for n in names:\n"
        "    for k in [k for k in sys.modules if k == 'optimize' or k.startswith('optimize.')]:\n"
        "        del sys.modules[k]\n"
        "    try:\n"
        "        importlib.import_module(n)\n"
        "    except Exception as e:\n"
        "        bad.append(f'{n}: {e!r}')\n"
        "    if 'tensorflow' in sys.modules:\n"
        "        bad.append(f'{n} imports tensorflow at import time')\n"
        "        break\n"
        "    if 'torch' in sys.modules and n not in extra:\n"
        "        bad.append(f'{n} imports torch at import time')\n"
        "        break\n"
        "print('\\n'.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", out.stdout


def _str_collections(tree: ast.AST):
    """Every tuple/list/set literal and dict-key set made only of string constants."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elts = node.elts
        elif isinstance(node, ast.Dict):
            elts = [k for k in node.keys if k is not None]
        else:
            continue
        values = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if values:
            yield node.lineno, set(values)


def test_scheme_delegate_target_and_io_names_are_defined_once():
    """vocab.py is the one place that lists scheme, delegate, target and I/O names together."""
    from optimize.core.vocab import IO, Delegate, Scheme, Target, names

    rules = {
        "delegate names": (set(names(Delegate)), lambda v: True),
        "target names": (set(names(Target)), lambda v: True),
        # dtype sets (float32, float16, int8) are not scheme lists: a scheme list names dynamic or int16x8
        "scheme names": (set(names(Scheme)), lambda v: bool(v & {"dynamic", "int16x8"})),
        "I/O names": (set(names(IO)), lambda v: "float" in v),
    }
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "vocab.py":
            continue
        for line, values in _str_collections(ast.parse(path.read_text())):
            for what, (vocab, extra) in rules.items():
                hit = values & vocab
                if len(hit) >= 3 and extra(hit):
                    found.append(f"{path.relative_to(PACKAGE)}:{line} lists {what} {sorted(hit)}")
    assert not found, "use optimize.core.vocab instead:\n" + "\n".join(found)


def test_no_function_is_too_complex():
    """No function above a cyclomatic complexity of 15 (what `radon cc -s optimize` reports)."""
    radon = pytest.importorskip("radon.complexity")
    over = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name.endswith("_generated.py"):  # flatc's output (scripts/generate_metadata_schema.sh)
            continue
        for block in radon.cc_visit(path.read_text()):
            if block.complexity > 15:
                over.append(f"{path.relative_to(PACKAGE)}:{block.lineno} {block.name} = {block.complexity}")
    assert not over, "split these:\n" + "\n".join(over)


def _commands():
    import typer.main

    from optimize.cli import app

    group = typer.main.get_command(app)
    out = {}
    for name, cmd in group.commands.items():
        subs = getattr(cmd, "commands", None)
        if subs:
            out.update({f"{name} {s}": c for s, c in subs.items()})
        else:
            out[name] = cmd
    return out


def _options(cmd) -> set[str]:
    return {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}


def test_every_command_has_help_with_an_example():
    for name, cmd in _commands().items():
        assert cmd.help and "Example:" in cmd.help, f"`optimize {name}` has no example in its help"
        for p in cmd.params:
            if p.param_type_name == "option" and p.name not in ("help",):
                assert p.help, f"`optimize {name}` option {p.opts[0]} has no help"


def test_every_command_in_the_readme_exists():
    """Each `optimize ...` command the README shows is a real command, and its options are real options."""
    cmds = _commands()
    shown = re.findall(r"`(optimize [^`]+)`", README.read_text())
    shown += re.findall(r"^(optimize [^\n#]+)", README.read_text(), flags=re.M)
    assert shown
    for text in shown:
        words = text.split()[1:]
        if not words or words[0].startswith("-"):
            continue
        name = " ".join(words[:2]) if " ".join(words[:2]) in cmds else words[0]
        assert name in cmds, f"README shows `{text}`, but `optimize {name}` is not a command"
        for opt in re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", text):
            assert opt in _options(cmds[name]) | {"--help"}, f"README shows `{text}`: {opt} is not an option of it"


def test_the_smoke_tier_names_tests_that_exist():
    """tests/conftest.py's SMOKE list names files and test functions; a renamed or removed one would leave the
    quick tier without its part of the pipeline, silently."""
    from conftest import SMOKE

    tests = Path(__file__).parent
    missing = []
    for name, chosen in SMOKE.items():
        path = tests / name
        if not path.is_file():
            missing.append(name)
            continue
        defined = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        missing += [f"{name}::{t}" for t in ([] if chosen == "*" else chosen) if t not in defined]
    assert not missing, f"SMOKE names what is not there: {missing}"
