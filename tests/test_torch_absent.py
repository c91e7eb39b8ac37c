"""Without the torch extra: a PyTorch or ONNX model is one line naming the extra, and nothing imports torch.
Runs whether or not torch is installed here (the child process hides it)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from tests_support import one_line_error

HIDE = (
    "import sys\n"
    "for m in ('torch', 'litert_torch', 'onnx', 'onnx2torch', 'onnxruntime'):\n"
    "    sys.modules[m] = None  # as if not installed: find_spec says None, import fails\n"
    "from optimize.cli import main\n"
    "main()\n"
)


def _cli_without_torch(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_a_pytorch_or_onnx_model_without_torch_names_the_extra(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07")  # never read: what it needs is missing
    with zipfile.ZipFile(tmp_path / "model.pt2", "w") as z:
        z.writestr("model/archive_format", "pt2")
    (tmp_path / "weights.pth").write_bytes(b"\x80\x02}q\x00.")
    r = _cli_without_torch("sweep", str(tmp_path / "model.onnx"), "-o", str(tmp_path / "out"))
    one_line_error(r, "model.onnx is an ONNX model", "which are not installed", 'pip install -e ".[torch]"')
    r = _cli_without_torch("quantize", str(tmp_path / "model.pt2"), "-s", "float16")
    one_line_error(r, "model.pt2 is a PyTorch model", 'pip install -e ".[torch]"')
    r = _cli_without_torch("compat", str(tmp_path / "weights.pth"))
    one_line_error(r, "weights.pth is a PyTorch file", "torch.export.save", 'pip install -e ".[torch]"')
    assert not (tmp_path / "out").exists()
