"""docs/delegate-rules-audit.md covers every check of the four rules modules, and stays accurate.

Fails when a function or an op-table entry of gpu.py, nnapi.py, hexagon.py or coreml.py has no audit row,
when a row names something that no longer exists, or when a row's "ours" line number is stale. After an
edit that moves code, `python tests/test_delegates_audit.py --fix` rewrites those line numbers.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AUDIT = ROOT / "docs" / "delegate-rules-audit.md"
MODULES = ("gpu", "nnapi", "hexagon", "coreml")
ROW = re.compile(r"^\| `(\w+)\.(\w+)` \((\w+)\.py:(\d+)\) \|", re.M)
SHARED = re.compile(r"^\| `(\w+)\.(\w+)`(?:, `(\w+)\.(\w+)`)? \|", re.M)


def _defs(module: str) -> dict[str, int]:
    tree = ast.parse((ROOT / "optimize" / "delegates" / f"{module}.py").read_text())
    return {n.name: n.lineno for n in tree.body if isinstance(n, ast.FunctionDef)}


def _section(text: str, module: str) -> str:
    start = text.index(f"(`optimize/delegates/{module}.py`)")
    end = text.find("\n## ", start)
    return text[start : end if end >= 0 else len(text)]


def _ops_rows(section: str) -> set[str]:
    table = section[section.index("### Op table") :]
    return {m.group(1) for m in re.finditer(r"^\| ([A-Z0-9_]+) \|", table, re.M)}


def test_every_check_function_has_a_row_with_its_line():
    text = AUDIT.read_text()
    for module in MODULES:
        defs = _defs(module)
        rows = {(m.group(2)): int(m.group(4)) for m in ROW.finditer(_section(text, module)) if m.group(1) == module}
        missing = sorted(set(defs) - set(rows))
        stale = sorted(set(rows) - set(defs))
        moved = sorted(name for name in set(rows) & set(defs) if rows[name] != defs[name])
        assert not missing, f"{module}.py functions without an audit row: {missing}"
        assert not stale, f"audit rows for {module}.py functions that no longer exist: {stale}"
        assert not moved, f"stale line numbers for {module}.py: {moved} (run: python {__file__} --fix)"


def test_every_op_table_entry_has_a_row():
    text = AUDIT.read_text()
    for module in MODULES:
        ops = set(importlib.import_module(f"optimize.delegates.{module}").OPS)
        if module == "nnapi":
            ops |= {"MUL", "DEQUANTIZE"}  # special-cased in nnapi.check
        rows = _ops_rows(_section(text, module))
        assert ops == rows, f"{module}: ops without a row {sorted(ops - rows)}, rows without an op {sorted(rows - ops)}"


def test_shared_machinery_rows_name_real_functions():
    text = AUDIT.read_text()
    shared = text[text.index("## Shared machinery") : text.index("\n## GPU")]
    names = [(m.group(1), m.group(2)) for m in SHARED.finditer(shared)]
    names += [(m.group(3), m.group(4)) for m in SHARED.finditer(shared) if m.group(3)]
    assert len(names) >= 10
    for module, attr in names:  # the delegates' own machinery, or the reader they share (optimize.models)
        package = "optimize.models" if module == "validate" else "optimize.delegates"
        assert hasattr(importlib.import_module(f"{package}.{module}"), attr), f"{module}.{attr}"


def test_every_row_cites_upstream_lines():
    text = AUDIT.read_text()
    for module in MODULES:
        for line in _section(text, module).splitlines():
            m = ROW.match(line)
            if m and "| ours |" not in line:
                upstream = line.split("|")[3]
                assert re.search(r"\.(cc|mm|h):\d+", upstream) or upstream.strip() == "-", line


def fix() -> None:
    """Rewrite the 'ours' line numbers of the audit from the code."""
    text = AUDIT.read_text()
    defs = {m: _defs(m) for m in MODULES}

    def repl(m: re.Match) -> str:
        module, name = m.group(1), m.group(2)
        line = defs.get(module, {}).get(name, int(m.group(4)))
        return f"| `{module}.{name}` ({module}.py:{line}) |"

    AUDIT.write_text(ROW.sub(repl, text))


if __name__ == "__main__":
    if "--fix" in sys.argv:
        fix()
