"""Issue 37, items 5 and 6: names from files never forge a line, a cache on a full disk still serves a run,
and `-o` that is a symbolic link is refused in one line.
"""

from __future__ import annotations

import errno

import numpy as np
import pytest
from tests_support import one_line_error

FORGED = "error: all good, exit 0"


def test_a_name_is_shown_as_itself_when_plain_and_quoted_otherwise():
    from optimize.core.shown import named

    for plain in ("x", "serving_default_x:0", "conv1.weight", "input_ids", "ü_in", "data/weights/w_0"):
        assert named(plain) == plain
    assert named("x\n" + FORGED) == "'x\\nerror: all good, exit 0'"
    assert named("a b") == "'a b'" and named("") == "''"
    assert named("x\x1b[2J\u202e") == "'x\\x1b[2J\\u202e'"
    assert named("k" * 200).endswith("...") and len(named("k" * 200)) == 83


@pytest.mark.parametrize(
    "keys, fragment",
    [
        (["x:input_1", "x:in\n" + FORGED], "has x:'in\\nerror: all good, exit 0', but the model's inputs are"),
        (["x\n" + FORGED], "unknown array 'x\\nerror: all good, exit 0'"),
    ],
)
def test_a_data_key_with_a_newline_stays_inside_its_line(cli, tmp_path, float_tflite, keys, fragment):
    data = tmp_path / "d.npz"
    np.savez(data, **{k: np.zeros((8, 8, 8, 1), np.float32) for k in keys}, y=np.zeros(8, np.int64))
    r = cli("sweep", str(float_tflite), "-d", str(data), "-o", str(tmp_path / "o"), "--no-cache")
    line = one_line_error(r, fragment)
    assert line.count("error:") == 2  # the forged one is quoted text inside the real one


def test_an_output_folder_that_is_a_symlink_is_refused(cli, tmp_path, float_tflite):
    """Writes stay inside what the user named: `-o link` (to a folder elsewhere) is one line naming the
    folder it points to, and nothing is written there."""
    real = tmp_path / "elsewhere"
    real.mkdir()
    link = tmp_path / "out"
    link.symlink_to(real)
    r = cli("quantize", str(float_tflite), "--scheme", "float16", "-o", str(link))
    one_line_error(r, "is a symbolic link", f"-o {real}")
    assert list(real.iterdir()) == []
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    one_line_error(cli("quantize", str(float_tflite), "--scheme", "float16", "-o", str(dangling)), "symbolic link")
    assert not (tmp_path / "nowhere").exists()


def test_a_cache_on_a_full_disk_serves_what_it_holds(tmp_path, float_tflite, data_npz, monkeypatch, caplog):
    """A local cache whose disk is full (every write: ENOSPC) still serves a run its entries cover, with one
    warning naming the real cause; no bucket or credential advice."""
    import optimize
    from optimize.core.recipe import build
    from optimize.engine import cache as result_cache
    from optimize.engine import storage

    recipe = build("f16", [{"technique": "convert", "scheme": "float16"}])
    kwargs = {"recipes": [recipe], "cache": str(tmp_path / "c"), "delegates": False}
    first = optimize.sweep(float_tflite, data_npz, tmp_path / "o1", **kwargs)
    assert not first.candidates[-1].cached

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage, "create_new", full)
    result_cache._CHECKED.clear()
    caplog.clear()
    again = optimize.sweep(float_tflite, data_npz, tmp_path / "o2", **kwargs)
    assert again.candidates[-1].cached and again.candidates[-1].ok
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len([s for s in said if "No space left on device" in s]) == 1, said
    assert not any("bucket" in s or "AWS" in s for s in said), said
