"""Issue 37: crafted .pt2 archives are refused by our own inspection, in one line, before torch reads them.

A seeded Linear(4, 3) with a buffer is exported (torch.export.save) and rewritten into each case of
tests/hostile_files.py: tensors whose sizes, strides or offset reach outside their storage or ask for
more than one tensor may hold (a stride-0 view of [2**33, 1024], stored or pickled), unknown dtypes and
layouts; duplicated member names, members under another root, two programs; node targets outside the
operators torch.export writes (`torch.serialization.os.system`, `builtins.eval`, dunder paths); a program
too big to convert; archives whose members expand beyond the per-archive bound (many just under the
per-member cap, one of 10 GiB, a zip bomb); names that would forge a line. Each runs through the CLI in a
child limited to 300 s and 8 GiB of address space: exit 2, one line, no traceback. The clean archive
converts.
"""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch extra (pip install -e '.[torch]') is not installed")
pytest.importorskip("litert_torch", reason="the torch extra is not installed")

import hostile_files as H  # noqa: E402
from tests_support import one_line_error  # noqa: E402

from optimize.core.errors import ModelError  # noqa: E402

CASES = [
    "stride0_weight", "offset_beyond_storage", "strides_beyond_storage", "negative_stride", "unknown_dtype",
    "sparse_layout", "target_os_system", "target_builtins_eval", "target_dunder", "target_load_library",
    "target_extension", "nodes_6000", "newline_weight_name", "deep_json", "pickled_stride0_sample",
    "duplicate_member", "member_under_other_root", "two_archive_formats", "absolute_member",
    "members_just_under_the_cap", "one_10gib_member", "zip_bomb",
]  # fmt: skip


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 3)
        self.register_buffer("c", torch.ones(3))

    def forward(self, x):
        return self.l(x) + self.c


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """(working folder, models folder, cache, data, the clean .pt2, the crafted ones)."""
    root = tmp_path_factory.mktemp("hostile-pt2")
    work, models, cache = root / "work", root / "models", root / "cache"
    H.plant_secrets(work, models)
    torch.manual_seed(0)
    base = models / "small.pt2"
    torch.export.save(torch.export.export(Small().eval(), (torch.zeros(1, 4),)), str(base))
    data = models / "d.npz"
    np.savez(data, x=np.random.default_rng(0).random((8, 4)).astype(np.float32))
    return work, models, cache, data, base, H.pt2_cases(base, models)


def test_every_case_is_built(place):
    assert sorted(place[5]) == sorted(CASES)


@pytest.mark.parametrize("case", CASES)
def test_a_crafted_pt2_is_one_line_before_torch_reads_it(place, case):
    work, _, cache, data, _, cases = place
    path, fragment = cases[case]
    r = H.run_limited("evaluate", str(path), "-d", str(data), cwd=work, cache=cache)
    one_line_error(r, path.name, fragment)
    assert not H.leaks([r.stdout, r.stderr], cache)


def test_the_inspection_refuses_before_torch_is_asked(place, monkeypatch):
    """torch.export.load is never called for a refused archive (the inspection is ours, not torch's)."""
    from optimize.convert.torch_files import load_pt2

    calls = []
    monkeypatch.setattr(torch.export, "load", lambda *a, **k: calls.append(a))
    for case in ("target_os_system", "duplicate_member", "member_under_other_root", "stride0_weight"):
        with pytest.raises(ModelError):
            load_pt2(place[5][case][0])
    assert calls == []


def test_the_clean_archive_converts(place):
    work, _, cache, data, base, _ = place
    r = H.run_limited("evaluate", str(base), "-d", str(data), cwd=work, cache=cache)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "vs PyTorch" in r.stdout.replace("\n", " ") or "PyTorch" in r.stdout


def test_targets_torch_export_writes_are_allowed(place):
    """Every target of a real exported program (and the symbolic-size helpers) passes the allowlist."""
    import json

    from optimize.convert.pt2_checks import allowed_target

    with zipfile.ZipFile(place[4]) as z:
        doc = json.loads(z.read(next(n for n in z.namelist() if n.endswith("models/model.json"))))
    targets = {n["target"] for n in doc["graph_module"]["graph"]["nodes"]}
    extra = {"_operator.getitem", "_operator.floordiv", "torch.sym_max", "math.trunc", "torch.ops.higher_order.cond"}
    extra |= {"torch.ops.aten.__and__.Tensor", "torch.ops.aten.__or__.Scalar"}  # a BertModel's mask writes these
    assert targets and all(allowed_target(t) for t in targets | extra)
    refused = ("torch.serialization.os.system", "os.system", "torch.ops.aten", "torch.ops.aten.__class__")
    refused += ("torch.ops.aten.__and__.__call__", "torch.ops.custom.__and__.Tensor", "torch.ops.__dict__.x")
    assert not any(allowed_target(t) for t in refused)
