"""The notebooks in notebooks/ run top to bottom on the demo model, and are stored clean.

Execution is slow (each notebook starts a kernel and imports TensorFlow; 01 runs the full demo sweep),
so it is marked slow. The notebooks share one output folder through OPTIMIZE_NOTEBOOK_OUT: 01 sweeps
into it, the others reuse that study (and sweep themselves when run alone). Each runs in notebooks/, as
`jupyter lab notebooks/` runs it, and must leave the checkout as it was, with no TensorFlow log line in
its outputs.
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
    before = _tree()
    client = NotebookClient(
        nb,
        kernel_name=_kernel_name(),
        timeout=CELL_TIMEOUT,
        resources={"metadata": {"path": str(ROOT / "notebooks")}},  # where `jupyter lab notebooks/` runs it
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on the first error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert _tree() == before, f"{path.name} left files in the checkout: {sorted(_tree() - before)}"
    logged = [line for line in _printed(nb) if TF_LOG.search(line)]
    assert not logged, f"{path.name} shows TensorFlow's log lines: {logged[:3]}"


#: A line of TensorFlow's (absl's) C++ log: `E0000 00:00:1795767471.781862 8299 cuda_executor.cc:...`, and
#: the start-up chatter that comes with it.
TF_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d|cuInit|oneDNN custom operations|absl::InitializeLog")


def _printed(nb) -> list[str]:
    """Every line a notebook's cells printed (streams and plain-text results)."""
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            text = o.get("text") or o.get("data", {}).get("text/plain", "")
            out += "".join(text).splitlines()
    return out


def _tree() -> set[str]:
    """The files below the checkout's notebooks/ and the checkout's top (where a stray optimize-out lands)."""
    top = {p.name for p in ROOT.iterdir()}
    return top | {str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").rglob("*")}


def test_the_notebooks_cross_reference_notebooks_that_exist():
    """01's "Next" once named three notebooks and said "Both"; every notebook named is one that exists."""
    names = {p.name for p in NOTEBOOKS}
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        text = "\n".join(c.source for c in nb.cells)
        for named in re.findall(r"\b0\d_[a-z_]+\.ipynb", text):
            assert named in names, f"{path.name} names {named}, which is not in notebooks/"
        assert "optimize-out" not in text, f"{path.name} writes into the checkout's optimize-out"
    first = nbformat.read(NOTEBOOKS[0], as_version=4).cells[-1].source
    assert all(p.name in first for p in NOTEBOOKS[1:]), "01's Next cell lists every other notebook"


def test_the_notebooks_extra_installs_jupyter():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("jupyterlab") for d in extras["notebooks"]), extras["notebooks"]
