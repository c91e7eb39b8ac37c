"""Non-destructive outputs (issue 43): no command writes over a file another study in its folder describes.

`optimize quantize mine.keras --scheme int8 -c mine.npz` after the demo's sweep replaced the demo's int8.tflite
without a word, and the demo's study.json then described bytes that were gone."""

from __future__ import annotations

import hashlib

import pytest
from study_fixtures import full_study

from optimize.core.errors import OptimizeError
from optimize.core.recipe import build
from optimize.engine import outputs, single


def _folder_with_a_study(tmp_path, model: str = "demo"):
    s = full_study()
    cands = [c.model_copy(update={"artifact": f"{c.name}.tflite"}) for c in s.candidates if c.ok]
    s = s.model_copy(update={"candidates": cands, "model": model})
    s.save(tmp_path / "study.json")
    for c in cands:
        (tmp_path / c.artifact).write_bytes(b"the study's own bytes: " + c.name.encode())
    return s


def _digests(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_single_run_never_writes_a_file_the_study_lists(tmp_path):
    _folder_with_a_study(tmp_path)
    before = _digests(tmp_path)
    recipe = build("int8", [{"technique": "convert", "scheme": "int8"}])
    # the model does not even exist: the refusal comes before any work (the model is never opened)
    with pytest.raises(OptimizeError) as e:
        single.run(recipe, tmp_path / "absent.keras", None, tmp_path)
    assert e.value.exit_code == 2
    assert "int8.tflite belongs to the study in" in e.value.problem and "(of demo" in e.value.problem
    assert "-o int8-out" in e.value.fix
    with pytest.raises(OptimizeError, match="belongs to the study"):  # the same file named by its path
        single.run(recipe, tmp_path / "absent.keras", None, tmp_path / "int8.tflite")
    assert _digests(tmp_path) == before


def test_a_name_the_study_does_not_list_is_free(tmp_path):
    _folder_with_a_study(tmp_path)
    outputs.refuse_overwrite(tmp_path, ["int8-mine.tflite"], "unused")  # nothing raised
    outputs.refuse_overwrite(tmp_path / "elsewhere", ["int8.tflite"], "unused")  # no study there
    (tmp_path / "study.json").write_text("not json")  # a file that describes nothing protects nothing
    outputs.refuse_overwrite(tmp_path, ["int8.tflite"], "unused")


def test_a_study_this_version_cannot_read_still_protects_its_files(tmp_path):
    (tmp_path / "study.json").write_text(
        '{"schema_version": 1, "model": "old", "candidates": [{"artifact": "int8.tflite"}]}'
    )
    with pytest.raises(OptimizeError, match="of old"):
        outputs.refuse_overwrite(tmp_path, ["int8.tflite"], "way out")


def test_a_sweep_of_another_model_is_refused_unless_told_to_replace(tmp_path):
    _folder_with_a_study(tmp_path, model="demo")
    with pytest.raises(OptimizeError) as e:
        outputs.refuse_another_model(tmp_path, "mine.keras", "f00d", replace=False)
    assert "holds the study of another model (demo" in e.value.problem and "--replace" in e.value.fix
    assert outputs.refuse_another_model(tmp_path, "mine.keras", "f00d", replace=True) is not None
    # the same model, by its bytes or by the path it was named by (a retrained file), replaces its own study
    assert outputs.refuse_another_model(tmp_path, "demo", "f00d", replace=False) is not None
    assert outputs.refuse_another_model(tmp_path, "mine.keras", "abc123", replace=False) is not None
    # before the model is opened, the path decides: the same file named another way is the same model
    _folder_with_a_study(tmp_path, model=str(tmp_path / "m.keras"))
    assert outputs.refuse_another_model(tmp_path, str(tmp_path / "." / "m.keras"), None, replace=False) is not None
    with pytest.raises(OptimizeError, match="another model"):
        outputs.refuse_another_model(tmp_path, str(tmp_path / "other.keras"), None, replace=False)


def test_a_sweep_of_another_model_is_refused_before_the_model_is_opened(tmp_path):
    from optimize.engine import sweeps

    _folder_with_a_study(tmp_path)
    before = _digests(tmp_path)
    with pytest.raises(OptimizeError, match="holds the study of another model"):  # the model does not even exist
        sweeps.sweep(tmp_path / "absent.keras", None, tmp_path, jobs=0)
    assert _digests(tmp_path) == before


def test_the_command_line_says_it_in_one_error_and_exits_2(tmp_path, cli):
    _folder_with_a_study(tmp_path)
    before = _digests(tmp_path)
    r = cli("quantize", str(tmp_path / "absent.keras"), "--scheme", "int8", "-o", str(tmp_path), env={"NO_COLOR": "1"})
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error:") and r.stderr.count("error:") == 1 and "Traceback" not in r.stderr
    assert "belongs to the study" in r.stderr and "Write elsewhere" in r.stderr
    assert _digests(tmp_path) == before
