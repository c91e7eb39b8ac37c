"""The notebooks in notebooks/ run top to bottom on the demo model, and are stored clean.

Execution is slow (each notebook starts a kernel and imports TensorFlow; 01 runs the full demo sweep),
so it is marked slow. The notebooks share one output folder through OPTIMIZE_NOTEBOOK_OUT: 01 sweeps
into it, the others reuse that study (and sweep themselves when run alone).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 600


def test_the_workflow_notebooks_exist():
    names = [p.name for p in NOTEBOOKS]
    for prefix in (
        "01_quickstart",
        "02_delegate_compatibility",
        "03_pruning_and_clustering",
        "04_choosing_a_scheme",
        "05_when_int8_hurts",
    ):
        assert any(n.startswith(prefix) for n in names), f"missing notebook {prefix}*.ipynb in {names}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_valid_and_clean(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs, f"{path.name} cell {i} is stored with outputs: clear them"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"
            # The notebooks teach the public API: no private modules.
            assert not re.search(r"optimize\._\w+|from optimize import _", cell.source), f"{path.name} cell {i}"


@pytest.fixture(scope="module")
def shared_out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("notebook-out")


def _kernel_name() -> str:
    """python3 if a kernelspec by that name exists (ipykernel ships one for the current interpreter)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        import subprocess

        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user", "--name", "python3"], check=True)
    return "python3"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, shared_out, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("OPTIMIZE_NOTEBOOK_OUT", str(shared_out))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    # The kernel must import this checkout's optimize, whatever its working directory.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name=_kernel_name(),
        timeout=CELL_TIMEOUT,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on the first error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
