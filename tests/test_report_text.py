"""The terminal tables read in plain text (issue 17): fidelity without labels, delegate glyphs that
differ per verdict without colour, columns chosen by what matters with a note on what was left out,
--wide that fits, the debug table with whole tensor names in a stated order, quantize's x column."""

from __future__ import annotations

import re
from pathlib import Path

from study_fixtures import candidate, full_study, report, reports, study

from optimize.core.results import DebugReport, DelegateReport, Fidelity, LayerError, OutputFidelity
from optimize.present.report_text import candidates_tables, debug_lines, print_candidates, print_study, verdict_glyph


def _plain(capsys) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)


def _words(out: str) -> str:
    """The output as one line (the legend wraps at the terminal's width)."""
    return " ".join(out.split())


def _unlabelled(c, rel: float, agree: float | None, samples: int = 360):
    fid = Fidelity(
        reference="float32.tflite",
        samples=samples,
        outputs=[OutputFidelity(name="y", mean_abs_diff=rel, std_abs_diff=0, max_abs_diff=rel, relative_error=rel)],
        top1_agreement=agree,
    )
    return c.model_copy(
        update={"metrics": c.metrics.model_copy(update={"accuracy": None, "accuracy_delta": None, "fidelity": fid})}
    )


def _label_free(samples: int = 360):
    return study(
        [
            candidate("float32", delta=None).model_copy(
                update={"metrics": candidate("float32", delta=None).metrics.model_copy(update={"fidelity": None})}
            ),
            _unlabelled(candidate("float16", "float16", size=78_000), 0.0002, 1.0, samples),
            _unlabelled(candidate("dynamic", "dynamic", size=41_000), 0.047, 0.99, samples),
            _unlabelled(candidate("int8", "int8", size=42_000), 0.128, 0.91, samples),
        ],
        data=None,
    )


def test_without_labels_the_table_shows_fidelity_and_its_samples(capsys):
    print_study(_label_free(), None, width=80)
    out = _plain(capsys)
    assert "rel err" in out and "agree" in out and " acc " not in out
    row = next(line for line in out.splitlines() if "│ int8 " in line)
    assert "12.80%" in row and "91.00%" in row
    assert "on 360 samples" in _words(out) and "*" not in row
    assert max(map(len, out.splitlines())) <= 80


def test_fidelity_from_few_samples_says_so(capsys):
    print_study(_label_free(samples=8), None, width=80)
    out = _plain(capsys)
    row = next(line for line in out.splitlines() if "│ int8 " in line)
    assert "12.80%*" in row and "fewer than 32 samples" in _words(out) and "on 8 samples" in _words(out)


def test_delegate_glyphs_differ_per_verdict_without_colour(capsys):
    build = DelegateReport(
        delegate="nnapi",
        source="rules",
        nodes_total=9,
        nodes_delegated=0,
        partitions=0,
        verdict="none",
        vetoed="build fails",
        veto_code="build-failure",
    )
    delegates = {**reports(gpu="full", hexagon="partial", coreml="none"), "nnapi": build}
    del delegates["xnnpack"]
    c = candidate("int8", "int8", delegates=delegates)
    assert [verdict_glyph(c, d) for d in ("gpu", "nnapi", "hexagon", "coreml", "xnnpack")] == ["G", "!", "h", "-", "."]
    print_study(study([candidate("float32"), c]), None, width=80)
    out = _plain(capsys)
    assert "G!h-." in out and "GNHCX" in out
    said = _words(out)
    assert "capital = runs the whole model" in said and "small = part of it" in said and "- = none" in said


def test_gzip_stays_when_pruned_candidates_exist_and_dropped_columns_are_named():
    tables, dropped = candidates_tables(full_study().candidates, full_study().candidates[0], width=80)
    headers = [c.header for c in tables[0].columns]
    assert "gzip" in headers  # the pruned candidate's whole benefit
    assert dropped and "mem" not in dropped  # the fixture has no memory: not a column at all
    assert all(d not in headers or d == "x" for d in dropped)
    no_prune = [c for c in full_study().candidates if c.name != "pruned"]
    tables, dropped = candidates_tables(no_prune, no_prune[0], width=60)
    assert "gzip" in dropped


def test_the_note_names_dropped_columns_and_wide(capsys):
    print_study(full_study(), None, width=80)
    out = _plain(capsys)
    note = next(line for line in out.splitlines() if line.startswith("Left out at 80 columns"))
    _, dropped = candidates_tables(full_study().candidates, full_study().candidates[0], width=80)
    assert "--wide" in note and f"columns: {', '.join(dropped)};" in note


def test_wide_shows_every_column_in_tables_that_fit(capsys):
    print_study(full_study(), None, width=80, wide=True)
    out = _plain(capsys)
    assert max(map(len, out.splitlines())) <= 80
    for col in ("size", "gzip", "acc", "Δ", "rel err", "agree", "p50 ms", "mem", "gpu", "nnapi", "xnnpack"):
        assert f" {col} " in out, col
    assert "…" not in out and out.count("┃ candidate") >= 2


def test_quantize_table_fills_x_and_names_the_file(tmp_path, capsys):
    c = candidate("int8", "int8").model_copy(update={"artifact": "m.tflite"})
    from optimize.core.results import Composition

    c = c.model_copy(
        update={"composition": Composition(weight_bytes={"int8": 250}, float32_equivalent_bytes=1000, float_ops=0)}
    )
    print_candidates([c], tmp_path, width=80)
    out = _plain(capsys)
    row = next(line for line in out.splitlines() if "│ int8 " in line)
    header = next(line for line in out.splitlines() if "┃ candidate" in line)
    path = str(tmp_path / "m.tflite")
    assert "0.25" in row and f"Wrote {path}" in " ".join(out.split())  # one message, wrapped or not
    # "x" is a ratio to the float32 baseline's file in a sweep; one run's weight ratio is a column named apart
    assert " w x " in header and " x " not in header.replace(" w x ", " "), header
    assert "w x = the weights' bytes over the same weights in float32" in _words(out)
    assert any(line.strip().endswith(path) for line in out.splitlines()), out  # the path whole, to be copied


def test_wrote_line_keeps_a_long_path_whole_at_80_columns(tmp_path, capsys):
    """A temp folder deep in a project tree: the 80-column wrap breaks before the path, never inside it."""
    deep = tmp_path / ("a-rather-long-folder-name-" * 4) / "out"
    c = candidate("int8", "int8").model_copy(update={"artifact": "m.tflite"})
    print_candidates([c], deep, width=80)
    lines = _plain(capsys).splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == str(deep / "m.tflite"))
    assert lines[at - 1].rstrip().endswith("Wrote")


def _layer(i: int, tensor: str, added: float, without: float | None = None) -> LayerError:
    return LayerError(
        op_index=i,
        op="FULLY_CONNECTED",
        tensor=tensor,
        dtype="int8",
        rmse=0.1,
        rmse_over_scale=0.3,
        mean_abs_error=0.05,
        max_abs_error=0.2,
        relative_rmse=0.01,
        error_added=added,
        weight_share=0.5,
        output_error_without=without,
    )


def test_debug_table_shows_whole_tensor_names_in_ranked_order():
    long = ";".join(f"model/block_{i}/conv2d/BiasAdd/ReadVariableOp" for i in range(4))
    rep = DebugReport(
        scheme="int8",
        samples=16,
        method="test",
        output_error=0.01,
        layers=[_layer(7, long, 0.002, 0.001), _layer(3, "model/dense/MatMul", 0.004), _layer(5, "short", 0.001)],
    )
    lines = debug_lines(rep, 80)
    assert max(map(len, lines)) <= 80
    joined = "".join(line.strip() for line in lines)
    assert long in joined  # folded over lines, never cut
    ranks = [int(m.group(1)) for line in lines if (m := re.match(r"\s+(\d+)\s+FULLY_CONNECTED #(\d+)", line))]
    assert ranks == [1, 2, 3]
    order = [m.group(1) for line in lines if (m := re.search(r"FULLY_CONNECTED #(\d+)", line))]
    assert order == ["7", "3", "5"]  # the report's ranking, as it says
    lstm = _layer(2, "lstm/out", 0.01).model_copy(update={"op": "UNIDIRECTIONAL_SEQUENCE_LSTM"})
    lines = debug_lines(rep.model_copy(update={"layers": [lstm]}), 80)
    assert max(map(len, lines)) <= 80 and "UNIDIRECTIONAL_SEQUENCE_LSTM: lstm/out" in "\n".join(lines)


def test_report_fixture_has_partial_and_none_verdicts():
    # a guard on the fixtures the glyph test relies on
    assert report("gpu", "partial").verdict == "partial" and report("gpu", "none").verdict == "none"


def _sweep_text(st, capsys, width: int = 80) -> str:
    print_study(st, Path("out"), width=width)
    return _plain(capsys)


def test_the_sweep_ends_with_a_file_or_a_blocker_for_every_target(capsys):
    """Every target gets a line: the .tflite to ship and why, or what keeps each candidate off it."""
    from optimize.present.report_text import SHIP_TARGETS

    st = full_study()
    partly = {"coreml": report("coreml", "partial", reason="RESHAPE to 2-D is not supported")}
    st = st.model_copy(
        update={"candidates": [c.model_copy(update={"delegates": {**c.delegates, **partly}}) for c in st.candidates]}
    )
    out = _sweep_text(st, capsys)
    tail = out[out.index("What to ship") :]
    answers = {}
    for line in tail.splitlines()[1:]:
        if line[:2] == "  " and line[2:].split(" ", 1)[0] in SHIP_TARGETS:
            target, _, answer = line.strip().partition(" ")
            answers[target] = answer.strip()
    assert set(answers) == set(SHIP_TARGETS), tail
    assert answers["cpu"].startswith("out/") and ".tflite (" in answers["cpu"], answers
    words = _words(tail)
    assert (
        "coreml nothing runs fully on coreml: float32 comes closest (10/12 nodes); blocked at #0 QUANTIZE: RESHAPE to 2-D"
        in words
    )
    assert "hexagon nothing runs fully on hexagon:" in words or "hexagon out/" in words


def test_identical_notes_are_said_once_naming_every_candidate(capsys):
    note = "quantize: LiteRT Quantizer recipe static_wi8_ai8, channel-wise weights, float I/O."
    cands = [candidate("float32")] + [
        candidate(n, "int8").model_copy(update={"notes": [note]}) for n in ("int8", "prune-int8", "cluster-int8")
    ]
    out = _sweep_text(study(cands), capsys)
    assert out.count("static_wi8_ai8") == 1, out
    assert f"int8, prune-int8, cluster-int8: {note}" in _words(out)


def test_no_line_ends_in_a_space(capsys):
    """A centred title's padding and the space rich breaks a line at are trimmed (17 lines had them)."""
    for width in (80, 120):
        out = _sweep_text(full_study(), capsys, width)
        assert not [line for line in out.splitlines() if line != line.rstrip()], out


def test_recommend_prints_its_recipe_only_when_asked():
    """The TOML recipe was 25 lines in the middle of the advice: now one line says how to get it."""
    import tomllib

    from optimize.decide.choose import recommend
    from optimize.present.report_text import format_recommendation

    rec = recommend(full_study(), "gpu")
    assert rec.chosen_recipe_toml
    text = format_recommendation(rec)
    assert "[[steps]]" not in text and "Its recipe, as TOML for `optimize run`: add --recipe." in text
    asked = format_recommendation(rec, recipe=True)
    toml = asked[asked.index("Recipe (") :].split("\n", 2)[2]
    assert asked.rstrip().endswith(toml.rstrip()) and tomllib.loads(toml)["name"] == rec.chosen


def test_the_pareto_front_is_of_what_runs_on_the_target():
    """int16x8 is on the study's front (no accuracy lost) but the GPU runs none of it: not on gpu's front."""
    from optimize.decide.choose import pareto_front, recommend

    st = full_study()
    assert "int16x8" in pareto_front(st.candidates, st.baseline)
    rec = recommend(st, "gpu")
    assert "int16x8" in {r.candidate for r in rec.rejected}
    assert rec.pareto and set(rec.pareto) <= set(rec.ranked)


def test_a_variant_of_an_alternative_is_named_not_called_unmeasured():
    """QAT then int8 with int8 I/O (the mcu's alternative) was measured with float I/O as qat-int8."""
    from optimize.core.results import Step
    from optimize.decide.choose import recommend

    qat = [Step(technique="qat", params={}), Step(technique="convert", params={"scheme": "int8", "io": "float"})]
    st = study(
        [
            candidate("float32"),
            candidate("int8-int8io", "int8", io="int8", size=41_000),
            candidate("qat-int8", "int8", size=41_000, steps=qat),
        ]
    )
    rec = recommend(st, "mcu")
    qat_alt = [a for a in rec.alternatives if a.startswith("quantization-aware")]
    assert qat_alt and "not measured in this study" not in qat_alt[0], rec.alternatives
    assert "measured with int8, float I/O as qat-int8" in qat_alt[0]


def test_each_fact_is_said_once():
    """int16x8's reference kernels were three facts on cpu (the rule of thumb, XNNPACK's coverage, its
    measured slowdown): one line now holds all three."""
    from optimize.decide.choose import recommend

    slow = candidate(
        "int16x8", "int16x8", size=48_000, p50=25.0, delegates=reports(xnnpack="partial", gpu="none", nnapi="none")
    )
    rec = recommend(study([candidate("float32"), candidate("int8", "int8", size=42_000, p50=0.6), slow]), "cpu")
    about = [f for f in rec.facts if "int16x8" in f]
    assert len(about) == 1, rec.facts
    assert "reference kernels" in about[0] and "XNNPACK takes 10/12" in about[0] and "25 ms vs 1 ms" in about[0]


def test_accuracy_from_a_thin_test_split_is_starred_and_said_so(capsys):
    """A 5-sample file tests on one sample: '100.00%' alone read as a real figure."""
    from optimize.core.results import Accuracy

    def thin(c):
        acc = Accuracy(samples=1, top1=1.0)
        return c.model_copy(update={"metrics": c.metrics.model_copy(update={"accuracy": acc})})

    out = _sweep_text(study([thin(candidate("float32")), thin(candidate("int8", "int8", size=42_000))]), capsys)
    row = next(line for line in out.splitlines() if "│ int8 " in line)
    assert "+0.00*" in row, out
    assert "* on acc and Δ = measured on 1 test sample(s), fewer than 32: a rough figure." in _words(out)
    out = _sweep_text(full_study(), capsys)
    assert "*" not in out.replace("**", "") and "rough figure" not in out


def test_a_long_output_folder_keeps_every_ship_line_within_80_columns(capsys):
    """A pytest temp folder is ~70 characters: indented under its target, the path would pass 80."""
    folder = Path("/tmp/pytest-of-root/pytest-12/test_long_output_fo0/o")  # with a file, 75 characters
    print_study(full_study(), folder, width=80)
    out = _plain(capsys)
    assert max(map(len, out.splitlines())) <= 80, [line for line in out.splitlines() if len(line) > 80]
    assert f"What to ship (in {folder}):" in _words(out) and "  cpu      artifacts/" in out
