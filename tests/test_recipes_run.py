"""Every shipped recipe, run end to end on the built-in demo model through the public API.

Each recipe must produce a measured candidate: the artifact on disk, the scheme its steps promise,
size, accuracy (within two points of the float baseline), latency, and a report from every delegate.
The demo model is trained once and cached (OPTIMIZE_CACHE or ~/.cache/optimize), so each case costs
one conversion (plus fine-tuning for prune/cluster/QAT recipes).
"""

from __future__ import annotations

import pytest

import optimize
from optimize.core.recipe import shipped_recipes
from optimize.core.vocab import TARGET_DELEGATE
from optimize.delegates import DELEGATES

pytestmark = pytest.mark.slow

RECIPES = sorted(shipped_recipes())


def test_recipes_are_shipped():
    assert len(RECIPES) >= 7, RECIPES


@pytest.mark.parametrize("name", RECIPES)
def test_shipped_recipe_runs_on_demo(name, tmp_path):
    recipe = optimize.load_recipe(name)
    if recipe.uses("pt2e"):  # PyTorch/ONNX models only (run for real in tests/test_torch.py): refused in one line
        from optimize.core.errors import RecipeError

        with pytest.raises(RecipeError, match="pt2e quantizes a PyTorch or ONNX model") as e:
            optimize.run(recipe, None, None, tmp_path, delegates=True, jobs=0)
        assert "--backend litert" in e.value.fix and not list(tmp_path.iterdir())
        return
    cand = optimize.run(recipe, None, None, tmp_path, delegates=True, jobs=0)
    if recipe.uses("yolo_head"):  # a raw YOLO head's detector only (tests/test_detect_layouts.py): refused here
        assert not cand.ok and "no raw yolo head" in cand.error, cand.error
        return

    assert cand.error is None, f"{name}: {cand.error}"
    assert cand.ok
    assert cand.name == recipe.name
    assert cand.scheme == recipe.scheme
    assert [s.technique for s in cand.steps] == [s.technique for s in recipe.with_backend().steps]
    artifact = tmp_path / cand.artifact
    assert artifact.is_file() and artifact.stat().st_size == cand.metrics.size.bytes

    m = cand.metrics
    assert 0 < m.size.gzip_bytes <= m.size.bytes
    assert m.accuracy is not None and m.accuracy.top1 is not None and m.accuracy.top1 > 0.9
    assert m.latency is not None and m.latency.p50_ms > 0
    if recipe.scheme != "float32":
        assert m.accuracy_delta is not None, f"{name}: no float baseline to compare with"
        assert m.accuracy_delta >= -0.02, f"{name}: accuracy dropped {-m.accuracy_delta:.3f}"
        assert m.fidelity is not None

    assert set(cand.delegates) == set(DELEGATES)
    for target in recipe.targets:
        delegate = TARGET_DELEGATE[target]
        if target in ("edgetpu", "mcu"):  # no delegate report: judged by scheme and integer I/O
            assert cand.scheme == "int8" and cand.io == "int8", f"{name}: {target} needs int8 I/O"
        elif target != "cpu":  # the CPU runs every op; XNNPACK coverage only shows in latency
            report = cand.delegates[delegate]
            assert report.nodes_delegated > 0, f"{name}: {delegate} takes no node: {report.cpu_nodes[:1]}"
