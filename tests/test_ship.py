"""A shipped file says how to feed it (issue 43 item 5): the I/O contract read from the artifact, TFLite metadata
written into it in the ecosystem's format and read back with the schema's own reader, the usage snippet and the
benchmark command `recommend` ends with, and the report's "what to ship" and "how to feed" sections."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
from tests_support import too_wide

from optimize.core.errors import DataError
from optimize.core.recipe import build
from optimize.core.results import load_study
from optimize.engine import sweeps
from optimize.models import metadata
from optimize.models import metadata_schema_generated as md
from optimize.models.contract import read_contract
from optimize.models.data import load_data

LABELS = [f"digit {i}" for i in range(10)]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory, keras_model, digits):
    """A sweep of float32 and int8 with integer I/O, on data that names its classes."""
    root = tmp_path_factory.mktemp("ship")
    np.savez(root / "d.npz", **digits, labels=np.array(LABELS))
    recipes = [
        build("float32", [{"technique": "convert", "scheme": "float32"}]),
        build("int8-int8io", [{"technique": "convert", "scheme": "int8", "io": "int8"}]),
    ]
    study = sweeps.sweep(keras_model, root / "d.npz", root / "out", recipes=recipes, runs=3, jobs=0)
    return root, study


def test_every_shipped_file_carries_metadata_the_schema_reader_reads_back(shipped):
    root, study = shipped
    assert all(c.ok for c in study.candidates), [c.error for c in study.candidates]
    for c in study.candidates:
        content = (root / "out" / c.artifact).read_bytes()
        meta = metadata.read(content)  # the flatc-generated reader of metadata_schema.fbs
        assert meta is not None, c.name
        assert meta.name == b"cnn" and meta.author == b"optimize" and meta.minParserVersion == b"1.0.0"
        assert c.name.encode() in meta.description
        sg = meta.subgraphMetadata[0]
        assert len(sg.inputTensorMetadata) == 1 and len(sg.outputTensorMetadata) == 1
        unit = sg.inputTensorMetadata[0].processUnits[0]  # [0, 1] images: (pixel - 0) / 255
        assert unit.optionsType == md.ProcessUnitOptions.NormalizationOptions
        assert unit.options.mean == [0.0] and unit.options.std == [255.0]
        assert sg.inputTensorMetadata[0].content.contentProperties.colorSpace == md.ColorSpaceType.GRAYSCALE
        out = sg.outputTensorMetadata[0].associatedFiles[0]
        assert out.name == b"labels.txt" and out.type == md.AssociatedFileType.TENSOR_AXIS_LABELS
        with zipfile.ZipFile(root / "out" / c.artifact) as z:  # packed as the ecosystem packs it: a zip after it
            assert z.read("labels.txt").decode().splitlines() == LABELS
        assert c.metrics.size.bytes == len(content)  # the size measured is the size shipped
        assert c.contract.metadata.startswith("TFLITE_METADATA (by optimize")


def test_the_int8_io_contract_is_the_files_own(shipped):
    from ai_edge_litert.interpreter import Interpreter

    root, study = shipped
    c = study.candidate("int8-int8io")
    it = Interpreter(model_path=str(root / "out" / c.artifact))
    (scale, zero), (oscale, ozero) = (
        it.get_input_details()[0]["quantization"],
        it.get_output_details()[0]["quantization"],
    )
    i, o = c.contract.inputs[0], c.contract.outputs[0]
    assert (i.dtype, o.dtype) == ("int8", "int8")
    assert i.scale == pytest.approx(scale) and i.zero_point == zero
    assert o.scale == pytest.approx(oscale) and o.zero_point == ozero
    assert i.range == pytest.approx([(-128 - zero) * scale, (127 - zero) * scale], abs=1e-5)
    assert i.range_from == "quantization" and i.shape[1:] == [8, 8, 1]
    f = study.candidate("float32").contract.inputs[0]
    assert f.dtype == "float32" and f.scale is None and f.range_from == "data" and f.range == [0.0, 1.0]
    again = load_study(root / "out")  # study.json holds it
    assert again.candidate("int8-int8io").contract == c.contract


def test_recommend_prints_the_scale_zero_point_usage_and_benchmark(shipped, cli):
    root, study = shipped
    c = study.candidate("int8-int8io").contract.inputs[0]
    r = cli("recommend", str(root / "out"), "--target", "mcu")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert f"scale {c.scale:.8g}, zero point {c.zero_point}" in text
    assert f"np.round(x / {c.scale:.8g}) + ({c.zero_point})" in text and "Interpreter(model_path=" in text
    assert not too_wide(r.stdout), too_wide(r.stdout)  # a long output folder stands whole on a line of its own
    r = cli("recommend", str(root / "out"), "--target", "gpu")
    assert r.returncode == 0, r.stderr
    assert "GpuDelegate()" in r.stdout and "MetalDelegate()" in r.stdout and "HardwareAccelerator" in r.stdout
    assert (
        "adb shell /data/local/tmp/benchmark_model \\\n    --graph=/data/local/tmp/int8-int8io.tflite \\\n" in r.stdout
    )
    assert "--use_gpu=true" in r.stdout and not too_wide(r.stdout), too_wide(r.stdout)
    assert "  adb push int8-int8io.tflite /data/local/tmp/" in r.stdout  # a long folder is said once, above


def test_the_sweep_summary_names_the_integer_pick_scale_and_zero_point(shipped):
    from optimize.present.report_text import next_steps

    root, study = shipped
    c = study.candidate("int8-int8io").contract.inputs[0]
    lines = " ".join(next_steps(study, None))
    assert f"int8 in, scale {c.scale:.6g}, zero point {c.zero_point}" in lines


def test_evaluate_reads_the_contract_from_the_file(shipped, cli):
    root, _ = shipped
    r = cli("evaluate", str(root / "out" / "int8-int8io.tflite"), "--json", "--runs", "2")
    assert r.returncode == 0, r.stderr
    contract = json.loads(r.stdout)["contract"]
    assert contract["inputs"][0]["dtype"] == "int8" and contract["inputs"][0]["zero_point"] is not None
    assert contract["metadata"].startswith("TFLITE_METADATA")
    r = cli("evaluate", str(root / "out" / "int8-int8io.tflite"), "--runs", "2")
    assert "zero point" in r.stdout and "metadata TFLITE_METADATA" in r.stdout


def test_report_without_a_target_says_what_to_ship_and_its_captions_say_what_is_drawn(shipped, cli, tmp_path):
    root, _ = shipped
    r = cli("report", str(root / "out"), "-o", str(tmp_path / "plain"))
    assert r.returncode == 0, r.stderr
    md_text = (tmp_path / "plain" / "report.md").read_text()
    assert "## What to ship" in md_text and "| mcu | int8-int8io.tflite" in md_text
    assert "## How to feed each file" in md_text and "zero point" in md_text
    assert "red star" not in md_text  # nothing chosen is drawn without --target
    html = (tmp_path / "plain" / "report.html").read_text()
    assert 'id="ship"' in html and 'id="contracts"' in html and "red star" not in html
    r = cli("report", str(root / "out"), "-o", str(tmp_path / "gpu"), "--target", "mcu")
    assert r.returncode == 0, r.stderr
    md_text = (tmp_path / "gpu" / "report.md").read_text()
    assert "Red star: int8-int8io, the choice for mcu" in md_text


def test_metadata_replaces_the_entry_a_quantized_copy_inherits(float_tflite):
    content = float_tflite.read_bytes()
    contract = read_contract(content, {"": (0.0, 1.0)})
    about = metadata.About("m", "first")
    once = metadata.embed(content, metadata.build(contract, about), {})
    twice = metadata.embed(once, metadata.build(contract, metadata.About("m", "second")), {})
    from ai_edge_litert import schema_py_generated as s

    model = s.Model.GetRootAs(twice, 0)
    names = [model.Metadata(i).Name() for i in range(model.MetadataLength())]
    assert names.count(b"TFLITE_METADATA") == 1 and metadata.read(twice).description == b"second"
    assert metadata.packed(twice) == {}


@pytest.mark.parametrize(
    "low, high, mean, std",
    [(0.0, 1.0, 0.0, 255.0), (-1.0, 1.0, 127.5, 127.5), (0.0, 255.0, 0.0, 1.0), (0.003, 0.995, 0.0, 255.0)],
)
def test_normalisation_maps_pixels_onto_the_range(low, high, mean, std):
    assert metadata.normalization(low, high) == pytest.approx((mean, std))


def test_labels_in_the_data_must_be_one_line_names(tmp_path, digits):
    np.savez(tmp_path / "d.npz", **digits, labels=np.array([1, 2, 3]))
    with pytest.raises(DataError, match="labels must be a 1-D array of class names"):
        load_data(tmp_path / "d.npz")
    np.savez(tmp_path / "d.npz", **digits, labels=np.array(["a\nb", "c"]))
    with pytest.raises(DataError, match="not one short line"):
        load_data(tmp_path / "d.npz")
    np.savez(tmp_path / "d.npz", **digits, labels=np.array(["cat", "dog"]))
    ds = load_data(tmp_path / "d.npz")
    assert ds.class_names == ("cat", "dog") and ds.fingerprint != load_data_without_labels(tmp_path, digits)


def load_data_without_labels(tmp_path, digits) -> str:
    np.savez(tmp_path / "plain.npz", **digits)
    return load_data(tmp_path / "plain.npz").fingerprint


def test_a_tflite_brought_with_its_own_metadata_keeps_it_and_its_labels(float_tflite, data_npz, tmp_path):
    """A .tflite whose author wrote metadata (MediaPipe's and Model Maker's models carry it): every candidate
    keeps that metadata, and the labels the author packed are packed with each candidate again."""
    content = float_tflite.read_bytes()
    contract = read_contract(content)
    theirs = metadata.build(contract, metadata.About("theirs", "the author's own words", ("a", "b")))
    theirs = theirs.replace(b"optimize", b"otherguy")  # another author, same length: the flatbuffer stays valid
    given = tmp_path / "given.tflite"
    given.write_bytes(metadata.embed(content, theirs, {"labels.txt": b"a\nb\n"}))
    recipes = [
        build("float16", [{"technique": "quantize", "scheme": "float16"}]),
        build("int8", [{"technique": "quantize", "scheme": "int8"}]),
    ]
    study = sweeps.sweep(given, data_npz, tmp_path / "out", recipes=recipes, runs=2, jobs=0, delegates=False)
    for c in study.candidates:
        assert c.ok, c.error
        shipped = (tmp_path / "out" / c.artifact).read_bytes()
        meta = metadata.read(shipped)
        assert meta.author == b"otherguy" and meta.description == b"the author's own words", c.name
        assert metadata.packed(shipped) == {"labels.txt": b"a\nb\n"}, c.name


def test_files_packed_after_a_model_are_read_bounded():
    """Labels packed after a model are read back; an archive member that expands like a zip bomb is not read."""
    import io

    plain = io.BytesIO(b"model bytes")
    with zipfile.ZipFile(plain, "a") as z:
        z.writestr("labels.txt", "a\nb\n")
    assert metadata.packed(plain.getvalue()) == {"labels.txt": b"a\nb\n"}
    bomb = io.BytesIO(b"model bytes")
    with zipfile.ZipFile(bomb, "a", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("labels.txt", b"0" * (metadata.MAX_PACKED_BYTES + 1))
    assert metadata.packed(bomb.getvalue()) == {} and metadata.packed(b"no archive") == {}
