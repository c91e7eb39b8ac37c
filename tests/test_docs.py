"""Docs that cannot drift: README.md, docs/ and recipes/README.md compared with the code.

The options table (docs/commands.md) lists every option of every command and nothing else; the recipe
keys, goals and technique params tables match the records and the registry; every `error:` line
recipes/README.md quotes is the one the code prints for that mistake; help texts that name choices or
ranges name the real ones; sizes are in one unit everywhere. The README stays a page: its two set-up
commands are the ones CI runs, its Python snippet has the main guard it recommends, no history; the
architecture page lists every module; the docs site's navigation holds every page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests_support import error_messages, one_line_error

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
RECIPES = (ROOT / "recipes" / "README.md").read_text()
COMMANDS = (ROOT / "docs" / "commands.md").read_text()


def _commands() -> dict[str, object]:
    import typer.main

    from optimize.cli import app

    out = {}
    for name, cmd in typer.main.get_command(app).commands.items():
        subs = getattr(cmd, "commands", None)
        out.update({f"{name} {s}": c for s, c in subs.items()} if subs else {name: cmd})
    return out


def _options(cmd) -> list[str]:
    """`-d/--data`, `--delegates/--no-delegates`, ...: how the options table spells each option."""
    out = []
    for p in cmd.params:
        if p.param_type_name == "option" and p.name != "help":
            out.append("/".join([*sorted(p.opts, key=len), *p.secondary_opts]))
    return out


def _table(text: str, header: str) -> dict[str, str]:
    """A Markdown table's rows under a header row that starts with `header`: first cell -> the rest."""
    lines = text[text.index(header) :].splitlines()
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = " | ".join(cells[1:])
    return rows


def test_options_table_lists_every_option_of_every_command():
    table = _table(COMMANDS, "| command | options |")
    commands = _commands()
    expected = {name: ", ".join(f"`{o}`" for o in _options(cmd)) or "-" for name, cmd in commands.items()}
    missing = [f"| `{n}` | {row} |" for n, row in expected.items() if table.get(n) != row]
    assert not missing, "docs/commands.md's options table should read:\n" + "\n".join(missing)
    assert set(table) == set(commands), f"docs list commands that do not exist: {set(table) - set(commands)}"


def test_options_in_the_recipes_readme_exist():
    commands = _commands()
    for text in re.findall(r"`(optimize [^`]+)`", RECIPES) + re.findall(r"^(optimize [^\n#]+)", RECIPES, re.M):
        words = text.split()[1:]
        name = " ".join(words[:2]) if " ".join(words[:2]) in commands else words[0]
        assert name in commands, text
        known = {o for p in commands[name].params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
        for opt in re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", text):
            assert opt in known, f"recipes/README.md shows `{text}`: {opt} is not an option of it"


def test_recipe_keys_and_goals_tables_match_the_records():
    from optimize.core.recipe import Recipe
    from optimize.core.results import Goals

    keys = _table(RECIPES, "| key | type | meaning |")
    fields = set(Recipe.model_fields) - {"source"}  # set by the loader: where the recipe came from
    assert set(keys) == fields - {"steps"} | {"[[steps]]"}, set(keys) ^ (fields - {"steps"} | {"[[steps]]"})
    goals_row = keys["goals"]
    block = RECIPES[RECIPES.index("[goals]") : RECIPES.index("[[steps]]")]
    for name in Goals.model_fields:
        assert f"`{name}`" in goals_row, f"recipes/README.md: the goals row does not name {name}"
        assert re.search(rf"^{name} = ", block, re.M), f"recipes/README.md: the [goals] example lacks {name}"


def test_technique_params_table_matches_the_registry():
    from optimize.core.registry import techniques

    table = _table(RECIPES, "| technique | stage | params (default) |")
    assert set(table) == set(techniques()), set(table) ^ set(techniques())
    for name, t in techniques().items():
        row = table[name]
        assert row.startswith(t.stage.value), (name, row)
        for field in t.params.model_fields:
            if field != "select_tf_ops":
                assert f"`{field}`" in row, f"recipes/README.md: {name}'s row does not name `{field}`"


BAD_RECIPES = {
    "unknown key 'foo'": 'foo = 1\n[[steps]]\ntechnique = "convert"\n',
    "goals: unknown key": '[goals]\nmax_drop = 0.01\n[[steps]]\ntechnique = "convert"\n',
    "'tpu' is not allowed": 'targets = ["tpu"]\n[[steps]]\ntechnique = "convert"\n',
    "unknown key 'epoch'": '[[steps]]\ntechnique = "prune"\nepoch = 2\n',
    "'int3' is not allowed": '[[steps]]\ntechnique = "convert"\nscheme = "int3"\n',
    "Unknown technique 'prun'": '[[steps]]\ntechnique = "prun"\n',
    "comes after a convert step": '[[steps]]\ntechnique = "convert"\n[[steps]]\ntechnique = "prune"\n',
}


def test_every_quoted_recipe_error_is_what_the_code_prints(tmp_path):
    """Each `error:` line of recipes/README.md is produced, word for word, by the mistake it shows."""
    from optimize.core.errors import RecipeError
    from optimize.core.recipe import load_recipe

    quoted = [line for line in RECIPES.splitlines() if line.startswith("error: bad.toml:")]
    printed = []
    for toml in BAD_RECIPES.values():
        (tmp_path / "bad.toml").write_text(toml)
        with pytest.raises(RecipeError) as e:
            load_recipe(tmp_path / "bad.toml")
        printed.append(f"error: {e.value}")
    assert quoted == printed, "recipes/README.md's Validation block should read:\n" + "\n".join(printed)


def test_help_texts_name_the_real_choices_and_ranges():
    """A help text that lists some of an option's choices lists all it accepts (and only those); a range
    written as `a..b` is the one the option enforces."""
    for name, cmd in _commands().items():
        for p in cmd.params:
            if p.param_type_name != "option":
                continue
            help_text = p.help or ""
            choices = _accepted(p)
            named = [c for c in choices if re.search(rf"(?<![\w-]){re.escape(c)}(?![\w-])", help_text)]
            if len(named) >= 2:
                assert set(named) == set(choices), f"optimize {name} {p.opts[0]}: help names {named} of {choices}"
            for lo, hi in re.findall(r"\b(\d+)\.\.(\d+)\b", help_text):
                assert (int(lo), int(hi)) == (p.min, p.max), f"optimize {name} {p.opts[0]}: {help_text}"


def _accepted(param) -> list[str]:
    """The values an enum option takes: its metavar's list where it narrows them (`[converter|litert|auto]`)."""
    import enum
    import typing

    ann = param.type_descriptor.annotation
    kinds = [a for a in (typing.get_args(ann) or (ann,)) if isinstance(a, type) and issubclass(a, enum.Enum)]
    if not kinds:
        return []
    narrowed = re.fullmatch(r"\[([\w|+-]+)\]", param.metavar or "")
    return narrowed.group(1).split("|") if narrowed else [str(v.value) for v in kinds[0]]


def test_backend_calibrator_is_refused_in_one_line(cli):
    r = cli("quantize", "m.tflite", "--backend", "calibrator")
    assert r.stderr.startswith("error: ") and len(error_messages(r.stderr)) == 1
    one_line_error(r, "calibrator")


def test_one_size_unit_on_screen_and_in_the_report():
    """Decimal kB and MB (what README says), through report.fmt_bytes, on the terminal and in report.md."""
    from study_fixtures import full_study

    from optimize.present import report, report_text

    assert "decimal kB and MB" in COMMANDS
    assert report_text.fmt_bytes is report.fmt_bytes
    assert report.fmt_bytes(152_000) == "152.0 kB" and report.fmt_bytes(2_500_000) == "2.50 MB"
    md = report.render_markdown(full_study())
    assert "152.0 kB" in md and "KB" not in md and "KiB" not in md
    from rich.console import Console

    con = Console(width=200, record=True)
    con.print(report_text.candidates_table(full_study().candidates, width=200))
    text = con.export_text()
    assert "152.0 kB" in text and "KB" not in text and "KiB" not in text


# ---- the README is a page a newcomer reads in five minutes; the rest is in docs/
def test_the_readme_is_a_page_without_history():
    lines = README.splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move detail into docs/"
    assert not [line for line in lines if len(line) > 120], "README.md lines over 120 characters"
    history = re.findall(r"(?i)\b(?:round[ -]\d+|issue[ -]?\d+|before issue)\b", README)
    assert not history, f"README.md holds history ({history}): it goes to CHANGELOG.md"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "Keep a Changelog" in changelog and "## [Unreleased]" in changelog


def test_the_readme_set_up_commands_are_the_ones_ci_runs():
    """The demo's one-liner and the test command, verbatim; .ci/run runs the latter as the README says,
    and builds the docs site."""
    demo = "pip install -e . && optimize sweep"
    tests = 'pip install -e ".[test]" && python -m pytest'
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    assert any(demo in b for b in blocks) and any(tests in b for b in blocks), blocks
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci.splitlines(), ".ci/run must run the README's test command verbatim"
    assert 'pip install -e ".[docs]"' in ci and "mkdocs build --strict" in ci


def test_the_readme_python_snippets_have_the_main_guard_they_recommend():
    """optimize.sweep or optimize.run called at a script's top level runs without crash isolation (and
    says so): a snippet that calls them does it under `if __name__ == "__main__":`."""
    import ast

    snippets = re.findall(r"```python\n(.*?)```", README, re.S)
    assert snippets
    for code in snippets:
        tree = ast.parse(code)
        for node in tree.body:
            top = (
                [n for n in ast.walk(node) if isinstance(n, ast.Call)]
                if not isinstance(node, ast.If | ast.FunctionDef)
                else []
            )
            called = [ast.unparse(c.func) for c in top]
            assert not any(c in ("optimize.sweep", "optimize.run") for c in called), code


def test_readme_links_point_at_files_that_exist():
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README):
        assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"


def test_the_architecture_page_lists_every_module():
    """docs/architecture.md's "Every module" block names each package and each module in it, so the layout
    a newcomer reads is the one on disk (a module moved or added fails this until the page follows)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("## Every module") :]
    block = block[block.index("```") : block.index("```", block.index("```") + 3)]
    words = set(re.findall(r"[A-Za-z_][\w]*", block))
    missing = []
    for py in sorted((ROOT / "optimize").rglob("*.py")):
        rel = py.relative_to(ROOT / "optimize")
        for package in rel.parts[:-1]:
            if package not in words:
                missing.append(f"{package}/")
        if py.stem != "__init__" and py.stem not in words:
            missing.append(str(rel))
    assert not missing, f"docs/architecture.md's module list lacks: {sorted(set(missing))}"


def test_the_docs_site_navigates_to_every_page_and_notebook():
    yaml = pytest.importorskip("yaml")

    class _Env(yaml.SafeLoader):
        pass

    _Env.add_constructor("!ENV", lambda loader, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Env)

    def pages(nav) -> list[str]:
        out = []
        for item in nav:
            for value in item.values() if isinstance(item, dict) else [item]:
                out += pages(value) if isinstance(value, list) else [value]
        return out

    listed = set(pages(config["nav"]))
    docs = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    notebooks = {f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert docs | notebooks == listed, (docs | notebooks) ^ listed


def test_the_docs_say_how_torch_and_torchvision_come_as_a_cpu_pair():
    """onnx2torch requires torchvision, and PyPI's is a CUDA build that fails to import beside a CPU torch, and
    with it `from transformers import BertModel`. The README's test command stays the one that works on a machine
    without PyTorch's index (CI's: naming an index it cannot reach costs pip about 8 s a package, ~35 minutes);
    README, getting-started and your-model say how to get the CPU pair where the index is reachable, and the one
    command that makes transformers import where PyPI's torchvision was installed. The extra pins torch exactly
    and leaves torchvision to follow it (each torchvision pins its torch)."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "torch==2.13.0" in extras["torch"] and not any(r.startswith("torchvision") for r in extras["torch"])
    cpu = "--extra-index-url https://download.pytorch.org/whl/cpu"
    for doc in ("README.md", "docs/getting-started.md", "docs/your-model.md"):
        text = " ".join((ROOT / doc).read_text().split())
        assert cpu in text and "pip uninstall -y torchvision" in text, doc


def _docs_figures():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "scripts" / "docs_figures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_figures_in_the_readme_and_getting_started_are_the_generated_ones():
    """The sweep's output and the demo's ratios on README.md and getting-started come from one recorded run
    (scripts/docs_figures.py writes docs/figures.json and rewrites the marked blocks from it): each block is
    exactly what the record renders, so a figure edited by hand or a block left behind fails here."""
    import json

    mod = _docs_figures()
    rec = json.loads((ROOT / "docs" / "figures.json").read_text())
    for name, lines in mod.blocks(rec).items():
        page = (ROOT / mod.PAGES[name]).read_text()
        assert mod.on_page(page, name) == lines, f"{mod.PAGES[name]}'s {name} block: run {mod.COMMAND}"
    assert rec["table"][0].startswith("┃ candidate") and rec["ship"][0].startswith("What to ship")
    shown = {r.split("│")[1].strip().rstrip("†") for r in rec["table"][1:]}  # † marks a retrained candidate
    assert set(mod.SHOWN_ROWS) <= shown, shown
    assert all(len(line) <= 80 for line in rec["table"] + rec["ship"])
