"""The hostile-input corpus (issue 11), one test per class: every bad input is one `error:` line, exit 2,
no traceback, nothing written. Cases that need a model use the session fixtures; the rest are cheap."""

from __future__ import annotations

import re

import numpy as np
import pytest
from tests_support import error_messages, one_line_error


@pytest.mark.parametrize(
    "field, expected",
    [
        ("technique = 5\n", "technique must be a technique's name"),
        ('technique = ["convert"]\n', "technique must be a technique's name"),
        ('technique = "convert"\nscheme = "int8"\nio = 5\n', "convert.io"),
    ],
)
def test_recipe_steps_of_the_wrong_type(cli, tmp_path, field, expected):
    r = tmp_path / "r.toml"
    r.write_text("[[steps]]\n" + field)
    one_line_error(cli("recipes", "validate", str(r)), "r.toml: step 1", expected)


@pytest.mark.parametrize(
    "head, expected",
    [
        ("name = 123\n", "name"),
        ("description = {a = 1}\n", "description"),
        ("model = 5\n", "model"),
        ('name = "/abs/path"\n', "name"),
        ('name = "../../x"\n', "name"),
        ('name = ""\n', "name"),
        ('name = ".hidden"\n', "name"),
        ('backend = "tpu"\n', "backend"),
    ],
)
def test_recipe_fields_of_the_wrong_type_or_unsafe_names(cli, tmp_path, head, expected):
    r = tmp_path / "r.toml"
    r.write_text(head + '[[steps]]\ntechnique = "convert"\n')
    one_line_error(cli("recipes", "validate", str(r)), "r.toml", expected)


def test_recipe_names_are_file_name_tokens():
    from optimize.core.errors import RecipeError
    from optimize.core.recipe import build

    assert build("int8-int8io.v2", [{"technique": "convert"}]).name == "int8-int8io.v2"
    for bad in ("a/b", "..", "x y", "", ".x", "a\\b"):
        with pytest.raises(RecipeError, match="name"):
            build(bad, [{"technique": "convert"}])


@pytest.mark.parametrize(
    "args, expected",
    [
        (("sweep", "--target", "tpu"), "'tpu' is not one of"),
        (("sweep", "--max-accuracy-drop", "-3"), "max_accuracy_drop"),
        (("sweep", "--threads", "100000"), "--threads"),
        (("sweep", "--threads", "0"), "--threads"),
        (("compat", "x.tflite", "--coreml-version", "9"), "--coreml-version"),
        (("recommend", "--objective", "speed"), "'speed' is not one of"),
        (("quantize", "m.keras", "--scheme", "int3"), "'int3' is not one of"),
        (("quantize", "m.keras", "--io", "int4"), "'int4' is not one of"),
    ],
)
def test_bad_options_are_refused_before_any_work(cli, tmp_path, args, expected):
    extra = ("-o", str(tmp_path / "out")) if args[0] == "sweep" else ()
    one_line_error(cli(*args, *extra, cwd=tmp_path), expected)
    assert not (tmp_path / "out").exists()


def test_qat_must_end_in_an_8bit_conversion():
    from optimize.core.errors import RecipeError
    from optimize.core.recipe import chain

    with pytest.raises(RecipeError, match="QAT then float16"):
        chain({"technique": "qat"}, "float16")
    assert chain({"technique": "qat"}, "int8")[-1] == {"technique": "convert", "scheme": "int8"}


def test_usage_errors_are_one_line(cli):
    one_line_error(cli("bogus"), "No such command 'bogus'")
    one_line_error(cli("quantize"), "Missing argument")
    assert cli().returncode == 0  # `optimize` alone prints its help


def test_fifos_devices_and_huge_files_are_refused_without_reading(cli, tmp_path, keras_model):
    import os

    fifo = tmp_path / "model.tflite"
    os.mkfifo(fifo)
    one_line_error(cli("quantize", str(fifo), "--scheme", "dynamic", timeout=60), "is a FIFO, not a model file")
    one_line_error(cli("quantize", "/dev/zero", "--scheme", "dynamic", timeout=60), "is a character device")
    one_line_error(
        cli("quantize", str(keras_model), "--scheme", "float16", "--data", str(fifo), timeout=60), "not a data file"
    )
    one_line_error(cli("evaluate", "/dev/zero", timeout=60), "is a character device")


def test_input_size_is_bounded(tmp_path, monkeypatch):
    from optimize.core import paths
    from optimize.core.errors import ModelError
    from optimize.models.source import open_model

    big = tmp_path / "big.tflite"
    big.write_bytes(b"\0" * 2048)
    monkeypatch.setattr(paths, "MAX_INPUT_BYTES", 1024)
    with pytest.raises(ModelError, match="optimize reads model files up to"):
        open_model(big)


@pytest.mark.parametrize("bad", ["afile", "afile/sub", "/sys/optimize-out", "/proc/optimize-out"])
def test_unwritable_outputs_are_refused_before_any_work(cli, tmp_path, keras_model, bad):
    (tmp_path / "afile").write_text("x")
    r = cli("quantize", str(keras_model), "--scheme", "float16", "-o", bad, cwd=tmp_path, timeout=120)
    one_line_error(r, "Cannot write into")


def test_a_full_stdout_is_one_line_not_a_traceback():
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-c", "from optimize.cli import main; main()", "recipes", "list"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert error_messages(r.stderr)[-1].startswith("error: cannot write")


def test_a_shared_recipe_cannot_write_anywhere(tmp_path):
    from optimize.core.errors import RecipeError
    from optimize.core.recipe import load_recipe

    for bad in ("/etc/x", "../../x", "out/../../x"):
        r = tmp_path / "r.toml"
        r.write_text(f'output = "{bad}"\n[[steps]]\ntechnique = "convert"\n')
        with pytest.raises(RecipeError, match="must be a relative folder"):
            load_recipe(r)


def test_a_full_disk_leaves_no_half_written_artifact(tmp_path, monkeypatch, keras_model, data_npz):
    import io
    import os

    import optimize
    from optimize.core.errors import OptimizeError
    from optimize.core.recipe import build

    real = os.fdopen

    class Full(io.FileIO):
        def write(self, b):
            super().write(bytes(b)[:4])
            raise OSError(28, "No space left on device", self.name)

    def fdopen(fd, mode="r", *a, **k):  # the artifact's temporary in the output folder fills the disk
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.startswith(str(tmp_path)) and ".f16.tflite." in target:
            return Full(fd, "wb")
        return real(fd, mode, *a, **k)

    monkeypatch.setattr(os, "fdopen", fdopen)
    recipe = build("f16", [{"technique": "convert", "scheme": "float16"}])
    with pytest.raises(OptimizeError, match="No space left on device"):
        optimize.run(recipe, keras_model, data_npz, tmp_path, jobs=0)
    assert not list(tmp_path.glob("*.tflite*")) and not list(tmp_path.glob(".*.tmp"))


# ---- issue 18: the one writer, the one reader, bounded parsing --------------------------------------------
def test_the_writer_never_follows_a_symlink_planted_in_the_output(tmp_path):
    """Writes outside -o (class 1): a link at the final name or at a temporary's name is replaced, never
    followed; a symlinked folder inside the root is refused."""
    from optimize.core.errors import OptimizeError
    from optimize.core.paths import copy_atomic, write_atomic

    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"victim")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("a.tflite", ".a.tflite.tmp", "b.tflite"):
        (out / name).symlink_to(victim)
    write_atomic(out / "a.tflite", b"model", root=out)
    (tmp_path / "src.bin").write_bytes(b"copied")
    copy_atomic(tmp_path / "src.bin", out / "b.tflite", root=out)
    assert victim.read_bytes() == b"victim"
    assert not (out / "a.tflite").is_symlink() and (out / "a.tflite").read_bytes() == b"model"
    assert not (out / "b.tflite").is_symlink() and (out / "b.tflite").read_bytes() == b"copied"
    (out / "sub").symlink_to(tmp_path)
    with pytest.raises(OptimizeError, match="through a symlink"):
        write_atomic(out / "sub" / "x.json", b"{}", root=out)
    assert not (tmp_path / "x.json").exists()
    assert sorted(p.name for p in out.iterdir()) == [".a.tflite.tmp", "a.tflite", "b.tflite", "sub"]


def test_the_reader_refuses_fifos_devices_and_links_to_them_without_blocking(tmp_path):
    """Hangs (class 4): opening a FIFO would wait for a writer forever; /dev/zero never ends."""
    import os
    import signal

    from optimize.core.errors import OptimizeError
    from optimize.core.paths import read_bounded

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "to-fifo").symlink_to(fifo)
    (tmp_path / "to-zero").symlink_to("/dev/zero")
    (tmp_path / "big").write_bytes(b"x" * 2048)
    (tmp_path / "link").symlink_to(tmp_path / "big")
    signal.alarm(20)  # a regression would block here: fail instead of hanging the suite
    try:
        for p, message in (
            (fifo, "is a FIFO"),
            (tmp_path / "to-fifo", "is a FIFO"),
            (tmp_path / "to-zero", "character device"),
            (tmp_path / "big", "up to 0.0009765"),
            (tmp_path / "nope", "No recipe file at"),
        ):
            with pytest.raises(OptimizeError, match=message):
                read_bounded(p, "recipe", limit=1024)
        with pytest.raises(OptimizeError, match="is a symlink"):
            read_bounded(tmp_path / "link", "cache entry", follow=False)  # where links are never wanted
    finally:
        signal.alarm(0)


def test_a_folder_input_is_walked_without_following_links_or_reading_fifos(tmp_path):
    """A SavedModel holding a FIFO, a link outside it, or a 1 TiB sparse asset is refused before anything
    hashes or loads it."""
    import os

    from optimize.core.errors import ModelError
    from optimize.core.paths import check_tree

    def fresh(name):
        d = tmp_path / name
        (d / "variables").mkdir(parents=True)
        (d / "saved_model.pb").write_bytes(b"pb")
        return d

    d = fresh("fifo")
    os.mkfifo(d / "variables" / "variables.index")
    with pytest.raises(ModelError, match="is a FIFO, inside the SavedModel"):
        check_tree(d, "SavedModel", ModelError)
    d = fresh("outside")
    (d / "assets").symlink_to("/etc")
    with pytest.raises(ModelError, match="links outside"):
        check_tree(d, "SavedModel", ModelError)
    d = fresh("sparse")
    with open(d / "huge.bin", "wb") as f:
        f.truncate(1 << 40)
    with pytest.raises(ModelError, match="optimize reads SavedModel files up to 16 GiB"):
        check_tree(d, "SavedModel", ModelError)
    d = fresh("fine")
    (d / "variables" / "v").write_bytes(b"v")
    (d / "alias").symlink_to(d / "variables")
    assert [p.name for p in check_tree(d, "SavedModel", ModelError)] == ["saved_model.pb", "v"]


def test_deep_json_and_zip_bombs_are_refused_before_parsing(tmp_path):
    """Tracebacks (class 5): 200,000-deep JSON raised RecursionError; a zip-bombed member, MemoryError."""
    import zipfile

    from optimize.core.bounded import loads_json, read_member
    from optimize.core.errors import ModelError

    with pytest.raises(ModelError, match="nested too deeply: more than 128 levels"):
        loads_json(b"[" * 200_000 + b"]" * 200_000, "config.json", ModelError)
    assert loads_json(b'{"a": "[[[[\\"[[", "b": [[1]]}', "x") == {"a": '[[[["[[', "b": [[1]]}
    p = tmp_path / "bomb.zip"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("metadata.json", b"{" + b" " * (64 << 20) + b"}")
    with zipfile.ZipFile(p) as z, pytest.raises(ModelError, match="a zip bomb"):
        read_member(z, "metadata.json", 2**30, "m.keras", ModelError)
    with zipfile.ZipFile(p) as z, pytest.raises(ModelError, match="expands to"):
        read_member(z, "metadata.json", 1 << 20, "m.keras", ModelError)
    npz = tmp_path / "bomb.npz"  # an .npy of zeros: its header is honest, its ratio is not
    with zipfile.ZipFile(npz, "w", zipfile.ZIP_DEFLATED) as z, z.open("x.npy", "w") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (1 << 24,)})
        f.write(b"\0" * (64 << 20))
    from optimize.core.errors import DataError
    from optimize.models.data import load_data

    with pytest.raises(DataError, match="a zip bomb"):
        load_data(npz)


@pytest.mark.parametrize(
    "text, message",
    [
        ("x = " + "[" * 20000 + "]" * 20000, "nested too deeply"),
        ("x = " + "{a = " * 20000 + "1" + "}" * 20000, "nested too deeply"),
        ("a" + ".a" * 20000 + " = 1", "nested too deeply"),  # tomllib takes ~30 s on this
        ('[[steps]]\ntechnique = "prune"\nlearning_rate = inf', "learning_rate: Input should be a finite number"),
        ('[[steps]]\ntechnique = "prune"\nlearning_rate = nan', "learning_rate: Input should be a finite number"),
        ('goals = {max_latency_ms = inf}\n[[steps]]\ntechnique = "convert"', "finite number"),
        ('output = "out\\u0000x"\n[[steps]]\ntechnique = "convert"', "output: holds the control character '\\x00'"),
        ('model = "m\\u001b[2J"\n[[steps]]\ntechnique = "convert"', "model: holds the control character"),
        ('description = "a\\u001b[31m"\n[[steps]]\ntechnique = "convert"', "description: holds the control"),
    ],
    ids=["deep-array", "deep-table", "deep-dotted-key", "lr-inf", "lr-nan", "goal-inf", "nul", "escape", "ansi"],
)
def test_hostile_recipes_are_one_line(tmp_path, text, message):
    from optimize.core.errors import RecipeError
    from optimize.core.recipe import load_recipe

    r = tmp_path / "r.toml"
    r.write_text(text + ('\n[[steps]]\ntechnique = "convert"\n' if "steps" not in text else "\n"))
    with pytest.raises(RecipeError, match="r.toml") as e:
        load_recipe(r)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_recipe_files_are_bounded_and_regular(tmp_path):
    import os

    from optimize.core.errors import RecipeError
    from optimize.core.recipe import load_recipe

    fifo = tmp_path / "r.toml"
    os.mkfifo(fifo)
    with pytest.raises(RecipeError, match="is a FIFO"):
        load_recipe(fifo)
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (2 << 20) + '\n[[steps]]\ntechnique = "convert"\n')
    with pytest.raises(RecipeError, match="up to 1 MiB"):
        load_recipe(big)
    (tmp_path / "latin.toml").write_bytes(b'name = "\xff"\n[[steps]]\ntechnique = "convert"\n')
    with pytest.raises(RecipeError, match="not UTF-8"):
        load_recipe(tmp_path / "latin.toml")
    ok = tmp_path / "ok.toml"
    ok.write_text('description = "two\\nlines\\tand a tab"\n[[steps]]\ntechnique = "convert"\n')
    assert load_recipe(ok).description == "two\nlines\tand a tab"


# ---- issue 18, phase B: models, data, outputs --------------------------------------------------------------
def _keras_variant(src, dst, config=None, metadata=None, weights=None):
    """A copy of a .keras archive with one member replaced (bytes or a JSON-able value)."""
    import json
    import zipfile

    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as out:
        for name, new in (("metadata.json", metadata), ("config.json", config), ("model.weights.h5", weights)):
            body = z.read(name) if new is None else new if isinstance(new, bytes) else json.dumps(new).encode()
            out.writestr(name, body)
    return dst


def test_hostile_keras_files_are_one_line_before_any_work(tmp_path, keras_model, data_npz):
    """Tracebacks and wrong exits (classes 5 and 6): deep JSON, a zip bomb, a foreign module, garbage
    weights, an unknown activation: each one ModelError before anything is written."""
    import json
    import zipfile

    import optimize
    from optimize.core.errors import ModelError
    from optimize.core.recipe import build

    config = json.loads(zipfile.ZipFile(keras_model).read("config.json"))
    foreign = json.loads(json.dumps(config))
    foreign["config"]["layers"][1].update(module="os", class_name="system")
    unknown = json.loads(json.dumps(config))
    unknown["config"]["layers"][1]["config"]["activation"] = "no_such_activation"
    cases = {
        "deep": (dict(config=b'{"config": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"), "nested too deeply"),
        "bomb": (dict(metadata=b'{"keras_version": "2.21.0"' + b" " * (80 << 20) + b"}"), "'metadata.json' expands"),
        "foreign": (dict(config=foreign), "names classes from 'os'"),
        "weights": (dict(weights=b"\x89HDF garbage" * 100), "Cannot load"),
        "activation": (dict(config=unknown), "Cannot load"),
    }
    recipe = build("f16", [{"technique": "convert", "scheme": "float16"}])
    for name, (members, message) in cases.items():
        path = _keras_variant(keras_model, tmp_path / f"{name}.keras", **members)
        out = tmp_path / f"out-{name}"
        with pytest.raises(ModelError, match=message) as e:
            optimize.run(recipe, path, data_npz, out, jobs=0)
        assert "\n" not in str(e.value) and not (out.exists() and any(out.iterdir())), name


def test_hostile_savedmodels_are_one_line_without_hanging(tmp_path, keras_model):
    """Hangs (class 4): variables/ as a FIFO, a link to one, a 1 TiB sparse asset; a link outside; a
    garbage fingerprint.pb (TensorFlow logged a traceback and carried on)."""
    import os
    import shutil
    import signal

    from optimize.convert.keras import export_saved_model
    from optimize.core.errors import ModelError
    from optimize.models import source as models

    base = tmp_path / "sm"
    export_saved_model(models.load_keras2(models.open_model(keras_model)), base)

    def variant(name, change):
        d = tmp_path / name
        shutil.copytree(base, d)
        change(d)
        return d

    def sparse(d):
        with open(d / "assets" / "huge.bin", "wb") as f:
            f.truncate(1 << 40)

    def fifo_index(d):
        (d / "variables" / "variables.index").unlink()
        os.mkfifo(d / "variables" / "variables.index")

    cases = {
        "fifo": (fifo_index, "is a FIFO, inside the SavedModel"),
        "outside": (lambda d: (d / "assets" / "passwd").symlink_to("/etc/passwd"), "links outside"),
        "sparse": (sparse, "up to 16 GiB"),
        "fingerprint": (lambda d: (d / "fingerprint.pb").write_bytes(b"\xff" * 300), "fingerprint.pb is not"),
    }
    signal.alarm(120)  # a regression hangs: fail instead
    try:
        for name, (change, message) in cases.items():
            (base / "assets").mkdir(exist_ok=True)
            with pytest.raises(ModelError, match=message):
                models.open_model(variant(name, change))
    finally:
        signal.alarm(0)


@pytest.mark.parametrize(
    "arrays, message",
    [
        (dict(x=np.ones((8, 8, 8, 1), np.complex64)), "x holds complex numbers (dtype complex64)"),
        (dict(x=np.zeros((8, 8, 8, 1), [("a", "<f4")])), "x holds structured records"),
        (dict(x=np.ones((8, 8, 8, 1)), y=np.array(["a"] * 8)), "y holds text"),
        (dict(x=np.ones((8, 8, 8, 1)), y=np.ones(8, np.complex64)), "y holds complex numbers"),
        (dict(x_train=np.ones((8, 8, 8, 1)), x_test=np.ones((0, 8, 8, 1))), "x_test has no samples"),
    ],
    ids=["complex-x", "structured-x", "str-labels", "complex-labels", "empty-x_test"],
)
def test_data_that_is_not_real_numbers_is_refused_by_name(arrays, message):
    """Crashes and tracebacks (classes 3 and 5): complex data with NaN reached calibration (SIGSEGV)."""
    from optimize.core.errors import DataError
    from optimize.models.data import from_arrays

    with pytest.raises(DataError, match=re.escape(message)):
        from_arrays(**arrays)


def test_data_beyond_the_input_type_and_labels_that_do_not_fit_are_refused_up_front(tmp_path, keras_model, digits):
    """float64 1e300 is infinite as float32 (it crashed calibration); labels of the wrong width or out of
    range are one line before anything is written (prune wrote into -o first)."""
    import optimize
    from optimize.core.errors import DataError
    from optimize.core.recipe import build

    x, y = digits["x_train"][:40], digits["y_train"][:40]
    big = x.astype(np.float64)
    big[0, 0, 0, 0] = 1e300
    recipe = build("prune", [{"technique": "prune"}, {"technique": "convert", "scheme": "int8"}])
    for name, arrays, message in (
        ("overflow", dict(x=big, y=y), "holds values up to 1e+300, beyond float32"),
        ("width", dict(x=x, y=np.eye(7)[y % 7]), "7 value(s) per sample; the output it belongs to has 10"),
        ("range", dict(x=x, y=y + 100), "class ids 100..109; the model has 10 classes"),
        ("float", dict(x=x, y=y + 0.5), "1 value(s) per sample; the output it belongs to has 10"),
    ):
        data = tmp_path / f"{name}.npz"
        np.savez(data, **arrays)
        out = tmp_path / f"out-{name}"
        with pytest.raises(DataError, match=re.escape(message)):
            optimize.run(recipe, keras_model, data, out, jobs=0)
        assert not (out.exists() and any(p for p in out.iterdir() if p.name != ".work")), name


@pytest.mark.parametrize("command", ["quantize", "evaluate", "compat"])
def test_a_signature_pointing_at_a_missing_subgraph_is_one_line(cli, tmp_path, float_tflite, data_npz, command):
    """Native crashes (class 3): `quantize --scheme float16` on it died of SIGSEGV."""
    from delegate_fixtures import load_t, save_t

    m = load_t(float_tflite.read_bytes())
    m.signatureDefs[0].subgraphIndex = 5
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(save_t(m))
    args = {"quantize": ("--scheme", "float16", "-o", str(tmp_path / "out")), "evaluate": ("--data", str(data_npz))}
    one_line_error(cli(command, str(bad), *args.get(command, ()), timeout=120), "runs subgraph 5")
    assert not (tmp_path / "out").exists()


def test_a_symlink_planted_in_the_output_is_replaced_not_followed(tmp_path, float_tflite):
    """Writes outside -o (class 1), through the pipeline: the artifact lands as a regular file."""
    import optimize
    from optimize.core.recipe import build

    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"victim")
    out = tmp_path / "out"
    out.mkdir()
    (out / "float16.tflite").symlink_to(victim)
    cand = optimize.run(build("float16", [{"technique": "quantize", "scheme": "float16"}]), float_tflite, output=out)
    assert cand.ok, cand.error
    assert victim.read_bytes() == b"victim" and not (out / "float16.tflite").is_symlink()
    assert (out / "float16.tflite").read_bytes()[4:8] == b"TFL3"


# ---- issue 18, phase B: the cache, signals, the pipe -------------------------------------------------------
def test_cache_entries_that_are_links_fifos_or_devices_are_rebuilt_without_hanging(tmp_path):
    """Hangs and writes outside the cache (classes 1 and 4): an artifact linked to /dev/zero, an entry that
    is a FIFO, a folder of the cache linked outside it."""
    import os
    import signal

    from optimize.engine.storage import LocalStore

    store = LocalStore(tmp_path / "cache")
    assert store.create("v4/entries/ab/k.json", b"{}") and not store.create("v4/entries/ab/k.json", b"x")
    assert store.read("v4/entries/ab/k.json", 100) == b"{}" and store.read("v4/entries/ab/none.json", 100) is None
    (tmp_path / "cache" / "v4" / "artifacts" / "cd").mkdir(parents=True)
    (tmp_path / "cache" / "v4" / "artifacts" / "cd" / "a.tflite").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "cache" / "v4" / "entries" / "ab" / "f.json")
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "cache" / "v4" / "entries" / "ef").symlink_to(outside)
    signal.alarm(20)  # a regression blocks on the FIFO: fail instead
    try:
        for key, message in (
            ("v4/artifacts/cd/a.tflite", "is a symlink"),
            ("v4/entries/ab/f.json", "is a FIFO"),
            ("v4/entries/ef/k.json", "through a symlink"),
        ):
            with pytest.raises(ValueError, match=message):  # the cache deletes and rebuilds such an entry
                store.read(key, 1 << 20)
        with pytest.raises(ValueError, match="through a symlink"):
            store.create("v4/entries/ef/new.json", b"{}")
        store.delete("v4/entries/ef/k.json")
    finally:
        signal.alarm(0)
    assert list(outside.iterdir()) == []


def test_a_sweep_interrupted_ends_in_one_line_and_leaves_the_output_as_it_was(tmp_path, float_tflite, data_npz):
    """Signals (class 6): Ctrl-C printed worker tracebacks and left half a sweep in -o, without study.json."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    args = ["sweep", str(float_tflite), "--data", str(data_npz), "-o", str(out), "--jobs", "2", "--no-cache"]
    p = subprocess.Popen(
        [sys.executable, "-c", "from optimize.cli import main; main()", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines = []
    for line in p.stderr:  # Ctrl-C once candidates are being produced in the workers
        lines.append(line)
        if ": producing" in line:
            break
    time.sleep(0.5)
    os.killpg(p.pid, signal.SIGINT)  # what a terminal does: the whole foreground group
    rest = p.stderr.read()
    p.wait(timeout=120)
    err = "".join(lines) + rest
    assert p.returncode == 130 and err.rstrip().splitlines()[-1] == "interrupted", err[-2000:]
    assert "Traceback" not in err and "Warning" not in err, err[-2000:]
    assert [q.name for q in out.iterdir()] == ["keep.txt"]


def test_an_interrupted_sweep_or_run_leaves_no_empty_output_folder(tmp_path, float_tflite, data_npz, monkeypatch):
    """Issue 29: a sweep interrupted (or aborted) whose -o did not exist left it behind as an empty folder;
    so did a single run. Folders that held something before are left as they were."""
    import optimize
    from optimize.core.recipe import build
    from optimize.engine import schedule, single, sweeps

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(schedule, "_round", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sweeps.sweep(float_tflite, data_npz, tmp_path / "new" / "out", jobs=0, cache=False)
    assert list(tmp_path.iterdir()) == []  # neither out nor the parent it made
    (tmp_path / "mine").mkdir()
    with pytest.raises(KeyboardInterrupt):
        sweeps.sweep(float_tflite, data_npz, tmp_path / "mine", jobs=0, cache=False)
    assert (tmp_path / "mine").is_dir() and list((tmp_path / "mine").iterdir()) == []
    monkeypatch.setattr(single, "executor", interrupted)
    with pytest.raises(KeyboardInterrupt):
        optimize.run(
            build("f16", [{"technique": "quantize", "scheme": "float16"}]), float_tflite, data_npz, tmp_path / "one"
        )
    assert not (tmp_path / "one").exists()


def test_workers_die_with_their_parent(tmp_path):
    """After `kill -9` of a sweep its workers lived on for 20 s and more (PR_SET_PDEATHSIG now)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import os, sys, time\n"
        "from optimize.engine.executors import _die_with_parent\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    _die_with_parent()\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(p.stdout.readline())
    time.sleep(0.5)  # the child has set its parent-death signal
    p.kill()
    p.wait()
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:
            if f.read().split(") ")[1].startswith("Z"):
                break  # dead, waiting for init to reap it
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the worker outlived its parent by 5 s")


@pytest.mark.parametrize("args", [("recipes", "list"), ("recipes", "techniques")])
def test_a_reader_that_closes_the_pipe_early_is_not_an_error(args):
    """Wrong exits (class 6): `optimize recipes list | head -1` exited 1."""
    import subprocess
    import sys

    p = subprocess.Popen(
        [sys.executable, "-c", "from optimize.cli import main; main()", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.readline()
    p.stdout.close()  # what `| head -1` does after its line
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0 and err == "", err


def test_terminal_text_is_shown_not_obeyed(cli, tmp_path, float_tflite):
    """Terminal injection (class 2): names with newlines forged `error:` lines; escape sequences acted."""
    from optimize.core.shown import escape

    assert escape("a\nerror: x\x1b[2J\u202e\udcff\tü") == "a\\nerror: x\\x1b[2J\\u202e\\xff\tü"
    from optimize.present.report_text import esc

    assert esc("n\nerror: [b]x\x1b[2J") == "n\\nerror: \\[b]x\\x1b[2J"  # tables: neither markup nor terminal codes
    bad = tmp_path / "m\nerror: FORGED\x1b[2J.tflite"
    r = cli("evaluate", str(bad))
    line = one_line_error(r, "m\\nerror: FORGED\\x1b[2J.tflite")
    assert "\x1b" not in r.stderr and line.count("error:") == 2  # the forged one stays inside the line


def test_log_lines_show_names_from_outside_escaped(capsys):
    import logging

    from optimize.present.progress import configure

    log = logging.getLogger("optimize")
    saved = (list(log.handlers), log.propagate, log.level)
    try:
        configure(live=False)
        log.warning("cache entry for %s is corrupt", "x\nerror: FORGED\x1b[2J")
        err = capsys.readouterr().err
    finally:
        log.handlers[:], log.propagate, log.level = saved[0], saved[1], saved[2]
    assert err == "cache entry for x\\nerror: FORGED\\x1b[2J is corrupt\n", err
