"""Trust boundaries (issue 41): a cache no other user can poison, and no file that crashes the runtime.

The crafted corpus (tests/trust_files.py and the cases here): a cache owned by another user, a world- and a
group-writable cache, a forged entry (the issue's attack: another model's artifact behind rewritten digests), an
entry under another key, a key file others can read; each quantization and sparsity defect, constant-backed
tensors; a NUL and 1 MB of text in a study, Markdown in names. Every command ends in exit 0, or in one `error:`
line and exit 2: no traceback, no signal, within 300 s and 8 GiB of address space (`hostile_files.run_limited`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys

import numpy as np
import pytest
import trust_files
from hostile_files import run_limited
from tests_support import one_line_error

from optimize.core.errors import ModelError
from optimize.engine.cache import CACHE_FORMAT


def clean(r, *said) -> None:
    """Exit 0, or one `error:` line and exit 2; never a traceback or a signal."""
    assert r.returncode in (0, 2), (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr + r.stdout, r.stderr[-2000:]
    if r.returncode == 2:
        one_line_error(r, *said)


# ------------------------------------------------------------------------------------------ the corpus


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("bases")
    out = {"int8": trust_files.int8_base(), "sparse": trust_files.sparse_base()}
    out["blocked"] = trust_files.blocked(out["sparse"])
    for name, data in out.items():
        (folder / f"{name}.tflite").write_bytes(data)
    return {name: folder / f"{name}.tflite" for name in out}


@pytest.fixture(scope="module")
def corpus(bases, tmp_path_factory) -> dict:
    """Every crafted .tflite: name -> (path, what its one error line says)."""
    folder = tmp_path_factory.mktemp("corpus")
    int8, sparse = bases["int8"].read_bytes(), bases["sparse"].read_bytes()
    cases = {**trust_files.quant_cases(int8), **trust_files.sparse_cases(sparse), **trust_files.const_cases(int8)}
    out = {}
    for k, (name, (data, said)) in enumerate(cases.items()):
        path = folder / f"case{k}.tflite"
        path.write_bytes(data)
        out[name] = (path, said)
    return out


def test_every_crafted_tflite_is_refused_naming_its_tensor(corpus):
    from optimize.models.tflite import read_model

    for name, (path, said) in corpus.items():
        with pytest.raises(ModelError, match=re.escape(said)) as e:
            read_model(path)
        assert "tensor" in str(e.value) and "\n" not in str(e.value), name


def test_valid_sparse_layouts_are_accepted_and_run_as_written(bases):
    """The converter's CSR layout and a 1x4-blocked one both pass, and the runtime gives the same outputs."""
    from optimize.models import runtime
    from optimize.models.normalize import normalize
    from optimize.models.tflite import read_model

    x = np.random.default_rng(0).random((1, 32), np.float32)
    outs = []
    for name in ("sparse", "blocked"):
        read_model(bases[name])
        outs.append(runtime.Runner(runtime.load(bases[name], threads=1)).run(x)[0])
        dense = normalize(bases[name].read_bytes())  # densified, its sparse originals left with no data
        assert dense.facts == ["2 sparse weight tensor(s) densified"]
        outs.append(runtime.Runner(runtime.load(dense.content, threads=1)).run(x)[0])
    for out in outs[1:]:
        np.testing.assert_allclose(out, outs[0], rtol=1e-6)


def test_zero_scales_converters_write_on_constants_are_accepted(bases):
    """TensorFlow's int16x8 converter gives an all-zero channel a scale of 0; a weight channel's 0 dequantizes
    to 0 and runs. Only what the runtime computes (inputs, activations, outputs) must have a scale above 0."""
    from optimize.models import runtime
    from optimize.models.flatbuffer import _parse
    from optimize.models.tflite import read_model

    content = trust_files.zero_channel_int16x8()
    assert any(t.is_const and t.quant is not None and 0.0 in t.quant.scales for t in _parse(content).main.tensors)
    read_model(content)
    runner = runtime.Runner(runtime.load(content, threads=1))
    assert np.isfinite(runner.run(np.ones((1, 8, 8, 3), np.float32))[0]).all()


@pytest.mark.parametrize("command", ["evaluate", "compat"])
def test_the_scale_that_crashed_litert_is_one_line(corpus, tmp_path, command):
    """An int8 input whose scale is 0 made LiteRT segfault in allocate_tensors: exit 139, compat silent."""
    path, said = corpus["input scale 0 (the segfault)"]
    r = run_limited(command, str(path), cwd=tmp_path, cache=tmp_path / "cache")
    one_line_error(r, said, path.name, "re-export the model")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["evaluate", "compat"])
def test_the_whole_tflite_corpus_is_one_line_in_evaluate_and_compat(corpus, tmp_path, command):
    for name, (path, said) in corpus.items():
        r = run_limited(command, str(path), cwd=tmp_path, cache=tmp_path / "cache")
        assert r.returncode == 2, (name, r.returncode, r.stderr[-1000:])
        one_line_error(r, said)


def test_nonsense_sparsity_is_never_copied_into_a_written_model(corpus, tmp_path):
    """Issue 41: traversal order [0, 7, 9] and segments [0, 2147483647, -4] went into int8.tflite, exit 0."""
    path, said = corpus["issue 41's: order [0, 7, 9], segments [0, 2147483647, -4]"]
    out = tmp_path / "out"
    r = run_limited("quantize", str(path), "--scheme", "dynamic", "-o", str(out), cwd=tmp_path, cache=tmp_path / "c")
    one_line_error(r, said)
    assert not out.exists()


def test_a_runtime_refusing_a_sample_is_a_model_error():
    """set_tensor's ValueError (`numpy array had 256 bytes but expected 16384`) was a worker's traceback."""
    from optimize.models import runtime

    class Refusing:
        def get_signature_list(self):
            return {}

        def get_input_details(self):
            return [{"name": "x", "index": 0, "shape": np.array([1, 4]), "dtype": np.float32, "quantization": (0, 0)}]

        def get_output_details(self):
            return [{"name": "y", "index": 1, "shape": np.array([1, 4]), "dtype": np.float32, "quantization": (0, 0)}]

        def _get_ops_details(self):
            return []

        def set_tensor(self, index, value):
            raise ValueError("numpy array had 256 bytes but expected 16384")

    loaded = runtime.Loaded(Refusing(), 0.0, [], False, 1)
    with pytest.raises(ModelError, match="refuses a sample for input x: numpy array had 256 bytes"):
        runtime.Runner(loaded).set_input(np.zeros((1, 4), np.float32))


# -------------------------------------------------------------------------------------- a crash is told

NO_VALIDATION = (
    "import optimize.models.tflite as t\n"
    "t.validate = lambda model, where: None\n"  # what the validator now refuses, let through to the runtime
    "from optimize.cli import main\n"
    "main()\n"
)


@pytest.mark.parametrize("command", ["evaluate", "compat"])
def test_a_native_crash_is_one_line_naming_the_step_and_the_file(corpus, tmp_path, command):
    path, _ = corpus["input scale 0 (the segfault)"]
    tmp = tmp_path / "t"
    tmp.mkdir()
    env = {**os.environ, "NO_COLOR": "1", "OPTIMIZE_CACHE": str(tmp_path / "c"), "TMPDIR": str(tmp)}
    r = subprocess.run(
        [sys.executable, "-c", NO_VALIDATION, command, str(path)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    one_line_error(r, "the LiteRT interpreter crashed (SIGSEGV) loading", path.name)
    assert list(tmp.iterdir()) == []  # the command's temporary folder went with the crash (the supervisor's)
    r = subprocess.run(
        [sys.executable, "-c", NO_VALIDATION, command, str(path)],
        capture_output=True, text=True, timeout=300, env={**env, "OPTIMIZE_NO_FORK": "1"}, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == -signal.SIGSEGV  # without the supervisor: the bare crash it replaces,
    assert [p.name.split("-")[1] for p in tmp.iterdir()] == [command]  # and the temporary folder it leaves


def test_a_scratch_folder_whose_supervisor_was_killed_is_cleared_by_the_next_command(tmp_path):
    """SIGKILL to the supervisor itself leaves its scratch folder (nothing of it runs to remove it): the next
    command's supervisor removes the scratch folders of processes that are gone, and no other."""
    from optimize.core import crash

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale, live = tmp_path / f"o-{gone.pid}-abc_12", tmp_path / f"o-{os.getpid()}-xyz"
    other = tmp_path / "o-notapid-1"
    for folder in (stale, live, other):
        (folder / "sub").mkdir(parents=True)
    crash._clear_stale(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


def test_the_crash_line_names_the_step_what_it_did_and_the_file():
    from optimize.core import crash

    crash.subject("m.keras")
    before = crash.now("")  # no step (an earlier test's interpreter may have left its own)
    try:
        assert crash.crash_line(signal.SIGKILL, "sweep").startswith("optimize sweep was killed (SIGKILL) on m.keras:")
        with crash.doing("the TFLite converter", None, "converting"):
            line = crash.crash_line(signal.SIGSEGV, "sweep")
            assert line.startswith("the TFLite converter crashed (SIGSEGV) converting m.keras. ")
            with crash.doing("the LiteRT interpreter", "x" * 5000 + ".tflite", "loading"):  # cut to the page
                assert crash.current()[:2] == ("the LiteRT interpreter", "loading")
            assert crash.current() == ("the TFLite converter", "converting", "m.keras")
        assert crash.current() == ("", "on", "m.keras")
    finally:
        crash.subject("")
        crash.restore(before)
    assert crash.command_of(["--verbose", "sweep", "m.keras"]) == "sweep"


ABORT_IN_THE_CONVERTER = (
    "import os\n"
    "import optimize.models.runtime as rt\n"
    "from optimize.core import crash\n"
    "def load(model, *a, **k):\n"
    "    with crash.doing('the TFLite converter', 'm [x](y).keras', 'converting'):\n"
    "        os.abort()\n"
    "rt.load = load\n"
    "from optimize.cli import main\n"
    "main()\n"
)


def test_an_abort_names_its_step_and_file_even_with_hostile_names(float_tflite, tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", ABORT_IN_THE_CONVERTER, "evaluate", str(float_tflite)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"}, cwd=tmp_path,
    )  # fmt: skip
    one_line_error(r, "the TFLite converter crashed (SIGABRT) converting m [x](y).keras")


SLOW_LOAD = (
    "import sys, time\n"
    "import optimize.models.runtime as rt\n"
    "def load(*a, **k):\n"
    "    print('loading', flush=True)\n"
    "    time.sleep(120)\n"
    "rt.load = load\n"
    "from optimize.cli import main\n"
    "main()\n"
)


@pytest.mark.parametrize("sig, code, said", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_signals_sent_to_the_command_reach_it_through_the_supervisor(float_tflite, tmp_path, sig, code, said):
    p = subprocess.Popen(
        [sys.executable, "-c", SLOW_LOAD, "evaluate", str(float_tflite)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert p.stdout.readline().strip() == "loading"
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == code and err.strip().splitlines()[-1] == said and "Traceback" not in err, err


# ---------------------------------------------------------------------------------------------- the cache


def _entries(root):
    return sorted(root.rglob("entries/*/*.json"))


def test_a_cache_folder_others_can_write_or_own_is_not_used(tmp_path, caplog):
    from optimize.engine.cache import result_cache

    for mode, said in ((0o777, "writable by everyone (mode 0777)"), (0o770, "writable by its group (mode 0770)")):
        folder = tmp_path / f"c{mode:o}"
        folder.mkdir()
        folder.chmod(mode)
        caplog.clear()
        assert not result_cache(str(folder)).enabled
        assert [r.getMessage() for r in caplog.records if said in r.getMessage()], caplog.text
    parent = tmp_path / "open"  # a folder above the cache that others can write: they could swap the cache
    (parent / "cache").mkdir(parents=True)
    parent.chmod(0o777)
    assert not result_cache(str(parent / "cache")).enabled
    sticky = tmp_path / "sticky"  # ... unless sticky, as /tmp is: only an entry's owner can move it
    (sticky / "cache").mkdir(parents=True)
    sticky.chmod(0o1777)
    assert result_cache(str(sticky / "cache")).enabled
    if os.geteuid() == 0:  # another user's folder, as root can make one
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 4242, 4242)
        caplog.clear()
        assert not result_cache(str(theirs)).enabled
        assert "owned by another user (uid 4242)" in caplog.text


def test_a_world_writable_cache_is_one_warning_and_the_sweep_goes_on(float_tflite, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    r = run_limited("sweep", str(float_tflite), "--cache", str(shared), "-o", str(tmp_path / "o"), cwd=tmp_path,
                    cache=tmp_path / "unused")  # fmt: skip
    clean(r)
    assert r.returncode == 0 and r.stderr.count("is not used") == 1 and "writable by everyone" in r.stderr
    assert not any(shared.rglob("*.json")) and "reused from the cache" not in r.stderr


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("OPTIMIZE_CACHE", str(root))
    return root


def _sweep(keras_model, data_npz, out):
    from optimize.core.recipe import build
    from optimize.engine import sweeps

    recipes = [
        build("float32", [{"technique": "convert"}]),
        build("int8", [{"technique": "convert", "scheme": "int8"}]),
    ]
    return sweeps.sweep(keras_model, data_npz, out, recipes=recipes, delegates=False, runs=3, jobs=0)


def test_a_forged_entry_is_rebuilt_never_shipped(keras_model, data_npz, tmp_path, cache_root, caplog):
    """The issue's attack: another model's artifact behind the int8 entry, its two digests rewritten. Digests
    prove a file intact, not who wrote it; the entry's MAC does."""
    import hashlib

    cold = _sweep(keras_model, data_npz, tmp_path / "a")
    honest = (tmp_path / "a" / "int8.tflite").read_bytes()
    planted = (tmp_path / "a" / "float32.tflite").read_bytes()
    for entry in _entries(cache_root):
        doc = json.loads(entry.read_text())
        if json.loads(doc["record"])["name"] == "int8":
            sha = hashlib.sha256(planted).hexdigest()
            art = cache_root / "results" / f"v{CACHE_FORMAT}" / "artifacts" / sha[:2] / f"{sha}.tflite"
            art.parent.mkdir(parents=True, exist_ok=True)
            art.write_bytes(planted)
            doc["artifact_sha256"], doc["artifact_bytes"] = sha, len(planted)
            entry.write_text(json.dumps(doc))
    caplog.clear()
    warm = _sweep(keras_model, data_npz, tmp_path / "b")
    int8 = warm.candidate("int8")
    assert not int8.cached and warm.candidate("float32").cached
    assert (tmp_path / "b" / "int8.tflite").read_bytes() == honest != planted
    assert "not signed with this cache's key" in caplog.text
    assert int8.metrics.size == cold.candidate("int8").metrics.size


def test_a_team_bucket_serves_its_key_holders_and_no_one_else(float_tflite, tmp_path, monkeypatch):
    """An s3:// cache (moto): a teammate with the team's key is served; an entry forged by someone who can write
    the bucket but holds no key is rebuilt, never shipped."""
    pytest.importorskip("s3fs")
    import hashlib

    import fsspec
    from servers import moto_s3

    from optimize.core.recipe import as_given, build
    from optimize.engine import sweeps

    recipes = [as_given("float32"), build("float16", [{"technique": "quantize", "scheme": "float16"}])]
    monkeypatch.setenv("OPTIMIZE_CACHE_KEY", "the team's secret, from CI's vault")

    def sweep(out):
        return sweeps.sweep(float_tflite, None, out, recipes=recipes, delegates=False, runs=3, jobs=0, cache=url)

    with moto_s3("team") as bucket:
        url = f"{bucket}/opt"
        first = sweep(tmp_path / "a")
        assert all(c.cached for c in sweep(tmp_path / "b").candidates)  # a teammate: served
        fs = fsspec.filesystem("s3")
        planted = b"TFL3" + bytes(1000)  # anything: the attacker has no key to sign it with
        sha = hashlib.sha256(planted).hexdigest()
        for entry in fs.glob(f"{url[5:]}/results/v{CACHE_FORMAT}/*/entries/*/*.json"):
            doc = json.loads(fs.cat(entry))
            doc["artifact_sha256"], doc["artifact_bytes"] = sha, len(planted)
            fs.pipe(entry, json.dumps(doc).encode())
        fs.pipe(f"{url[5:]}/results/v{CACHE_FORMAT}/artifacts/{sha[:2]}/{sha}.tflite", planted)
        again = sweep(tmp_path / "c")
    assert not again.candidate("float16").cached
    assert (tmp_path / "c" / "float16.tflite").read_bytes() == (tmp_path / "a" / "float16.tflite").read_bytes()
    assert again.candidate("float16").metrics.size == first.candidate("float16").metrics.size


def test_entries_under_another_key_are_never_read(keras_model, data_npz, tmp_path, cache_root, monkeypatch):
    _sweep(keras_model, data_npz, tmp_path / "a")
    monkeypatch.setenv("OPTIMIZE_CACHE_KEY", "another team's secret, 32 chars")
    other = _sweep(keras_model, data_npz, tmp_path / "b")
    assert not any(c.cached for c in other.candidates)
    assert len({e.parent.parent.parent.name for e in _entries(cache_root)}) == 2  # two key ids, side by side


def test_a_served_artifact_must_have_the_graph_its_entry_names(float_tflite, tmp_path, caplog):
    """Signed, digests right, but the graph is not the one named: never copied out (re-signed here, as only a
    key holder could)."""
    from study_fixtures import candidate

    from optimize.core import trust
    from optimize.engine.cache import Entry, result_cache

    out = tmp_path / "out"
    out.mkdir()
    (out / "int8.tflite").write_bytes(float_tflite.read_bytes())
    cand = candidate("int8", "int8").model_copy(update={"artifact": "int8.tflite"})
    cache = result_cache(str(tmp_path / "c"))
    cache.put("a" * 64, cand, out)
    (entry,) = _entries(tmp_path / "c")
    doc = Entry.model_validate_json(entry.read_bytes()).model_copy(update={"graph_sha256": "b" * 64})
    entry.write_text(doc.model_copy(update={"mac": trust.seal(trust.cache_key(), doc.signed())}).model_dump_json())
    assert cache.get("a" * 64, "int8", tmp_path / "served") is None
    assert "graph is not the one the entry names" in caplog.text and not (tmp_path / "served").exists()


def test_what_was_known_about_a_model_is_signed_too(tmp_path):
    from optimize.engine.cache import result_cache
    from optimize.models.known import KnownModel

    known = result_cache(str(tmp_path / "c")).known()
    record = KnownModel(fingerprint="0" * 16, kind="keras2")
    known.put_model(record)
    assert known.model("0" * 16) == record
    (path,) = (tmp_path / "c").rglob("known/*/*.json")
    forged = json.loads(path.read_text())
    forged["record"] = forged["record"].replace('"keras2"', '"keras3"')
    path.write_text(json.dumps(forged))
    assert known.model("0" * 16) is None


def test_the_key_file_is_made_private_and_refused_when_others_can_read_it(tmp_path, monkeypatch, caplog):
    from optimize.core import trust
    from optimize.engine.cache import result_cache

    monkeypatch.delenv("OPTIMIZE_CACHE_KEY")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    trust._KEYS.clear()
    assert result_cache(str(tmp_path / "c")).enabled
    key = tmp_path / "config" / "optimize" / "cache-key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    first = trust.cache_key()
    trust._KEYS.clear()
    assert trust.cache_key() == first  # made once, then read
    key.chmod(0o644)
    trust._KEYS.clear()
    assert not result_cache(str(tmp_path / "c")).enabled
    assert "others can read or write it (mode 0644)" in caplog.text
    monkeypatch.setenv("OPTIMIZE_CACHE_KEY", "short")
    caplog.clear()
    assert not result_cache(str(tmp_path / "c")).enabled
    assert "too short to be a secret" in caplog.text
    trust._KEYS.clear()


# ------------------------------------------------------------------------------------ studies and names


@pytest.fixture(scope="module")
def study_file(tmp_path_factory):
    """A study as a sweep writes it (study_fixtures' full study, saved)."""
    from study_fixtures import full_study

    folder = tmp_path_factory.mktemp("study")
    full_study().save(folder / "study.json")
    return folder / "study.json"


def _edited(study_file, folder, edit):
    doc = json.loads(study_file.read_text())
    edit(doc)
    folder.mkdir()
    (folder / "study.json").write_text(json.dumps(doc))
    return folder


@pytest.mark.parametrize(
    "what, edit, said",
    [
        ("a 1 MB name", lambda d: d["candidates"][1].update(name="n" * 1_000_000), "at most 120 characters"),
        ("a name with Markdown", lambda d: d["candidates"][1].update(name="[x](javascript:alert(1))"), "pattern"),
        ("a NUL in a name", lambda d: d["candidates"][1].update(name="int8\x00"), "pattern"),
        ("2 MB of notes", lambda d: d["candidates"][1].update(notes=["n" * 2_000_000]), "at most 1048576"),
        ("a baseline named with a slash", lambda d: d.update(baseline="../x"), "baseline"),
    ],
)
def test_a_study_from_elsewhere_is_read_defensively(study_file, tmp_path, what, edit, said):
    folder = _edited(study_file, tmp_path / "s", edit)
    for command in (("report", str(folder)), ("recommend", str(folder), "--target", "cpu")):
        r = run_limited(*command, cwd=tmp_path, cache=tmp_path / "c")
        one_line_error(r, said)
    assert not (folder / "report.md").exists()


def test_long_lists_of_numbers_are_judged_whole_without_a_walk_of_each():
    """A study from elsewhere with millions of numbers in one list (a contract's shape) took a minute per ten
    million to judge one at a time; a list is judged by its first non-finite value and its extremes, which
    still finds the one bad value anywhere in it."""
    from study_fixtures import full_study

    from optimize.core.results import IOContract, TensorContract, _implausible, _numbers, check_plausible

    assert len(list(_numbers({"shape": [7] * 100_000}))) == 2
    for key, bad, said in (("range", float("nan"), "range.77777 is nan"), ("x_bytes", -3, "x_bytes.77777 is -3")):
        values = [5] * 100_000
        values[77_777] = bad
        whys = [_implausible(w, v) for w, v in _numbers({key: values})]
        assert [w for w in whys if w] and next(w for w in whys if w).startswith(said)
    s = full_study()
    wide = IOContract(inputs=[TensorContract(name="x", dtype="float32", shape=[1] * 100_000)], outputs=[])
    cands = [c.model_copy(update={"contract": wide}) for c in s.candidates]
    assert check_plausible(s.model_copy(update={"candidates": cands})) is None


def test_a_megabyte_of_notes_is_reported_not_refused(study_file, tmp_path):
    folder = _edited(study_file, tmp_path / "s", lambda d: d["candidates"][1].update(notes=["a note " * 140_000]))
    r = run_limited("report", str(folder), cwd=tmp_path, cache=tmp_path / "c")
    clean(r)
    assert r.returncode == 0 and (folder / "report.md").exists()


def test_a_study_the_tool_writes_always_reads_back(tmp_path):
    """A model whose output is named with a NUL swept fine; report and recommend then refused the tool's own
    study ("not a study optimize wrote ... Re-run optimize sweep", which loops)."""
    from study_fixtures import candidate, study

    from optimize.core.results import load_study

    note = "quantize: LiteRT Quantizer could not make this variant: no parameters for tensor: lo\x00gits\x1b[2J"
    s = study([candidate("float32"), candidate("int8", "int8").model_copy(update={"notes": [note]})])
    s.save(tmp_path / "study.json")
    read = load_study(tmp_path / "study.json")
    assert read.candidate("int8").notes == ["quantize: LiteRT Quantizer could not make this variant: no parameters "
                                            "for tensor: lo\\x00gits\\x1b[2J"]  # fmt: skip


def _live(html: str) -> list[str]:
    """Links, images and raw tags in rendered Markdown that are not the report's own plots."""
    tags = re.findall(r"<(?:a|img|script|iframe|svg|object)\b[^>]*>", html)
    return [t for t in tags if not re.fullmatch(r'<img (?:alt="[^"]*" )?src="[a-z_]+\.svg"(?: alt="[^"]*")? ?/?>', t)]


def test_report_md_has_nothing_live_from_a_name_in_any_viewer(tmp_path):
    import markdown
    import mistune
    from markdown_it import MarkdownIt
    from study_fixtures import candidate, full_study

    from optimize.decide.choose import recommend
    from optimize.present.report import render_markdown

    evil = trust_files.MARKDOWN
    base = full_study()
    cands = [
        c.model_copy(update={"error": evil, "notes": [evil]}) if c.name == "int8_io" else c for c in base.candidates
    ]
    cands.append(candidate("www.evil.example", "int8", error=evil))
    s = base.model_copy(update={"model": evil, "data": evil, "candidates": cands})
    md = render_markdown(s, recommend(s, "cpu"), images={"size_vs_accuracy": "size_vs_accuracy.svg"})
    renderers = {
        "Python-Markdown": lambda t: markdown.markdown(t, extensions=["tables", "fenced_code"]),
        "markdown-it (CommonMark, tables)": lambda t: MarkdownIt("commonmark").enable("table").render(t),
        "mistune (tables, bare URLs)": mistune.create_markdown(plugins=["table", "url", "strikethrough"]),
    }
    for name, render in renderers.items():
        html = render(md)
        assert not _live(html), (name, _live(html))
        assert "evil.example" in html, name  # the names are there, as text


@pytest.mark.slow
def test_a_model_with_a_nul_and_markdown_in_its_names_sweeps_and_reads_back(float_tflite, data_npz, tmp_path):
    """End to end: a model whose file and output are named with Markdown (and the output with a NUL) sweeps; its
    study reads back in report and recommend, and report.md holds nothing live."""
    from delegate_fixtures import load_t, save_t
    from markdown_it import MarkdownIt

    m = load_t(float_tflite.read_bytes())
    out = m.subgraphs[0].outputs[0]
    m.subgraphs[0].tensors[out].name = ("lo\x00gits " + trust_files.MARKDOWN).encode()
    model = tmp_path / "m [x](javascript:alert(1)) <b>.tflite"
    model.write_bytes(save_t(m))
    r = run_limited("sweep", str(model), "--data", str(data_npz), "-o", str(tmp_path / "o"), cwd=tmp_path,
                    cache=tmp_path / "c")  # fmt: skip
    clean(r)
    assert r.returncode == 0
    for command in (("report", str(tmp_path / "o")), ("recommend", str(tmp_path / "o"), "--target", "cpu")):
        r = run_limited(*command, cwd=tmp_path, cache=tmp_path / "c")
        clean(r)
        assert r.returncode == 0, r.stderr
    html = MarkdownIt("commonmark").enable("table").render((tmp_path / "o" / "report.md").read_text())
    assert not _live(html), _live(html)
