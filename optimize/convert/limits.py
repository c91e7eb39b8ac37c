"""What the PyTorch and ONNX front door reads at most, stated once: the bounds `onnx_checks` and
`pt2_checks` hold every file to before anything allocates or converts, and how names from a file are shown.

* one tensor: MAX_TENSOR_BYTES (2 GiB, what a .tflite flatbuffer can hold at most);
* all tensors of one model together: MAX_MODEL_BYTES (2 GiB);
* the graph converted: MAX_NODES nodes (5,000; `OPTIMIZE_MAX_NODES` sets another for a run), because
  torch.export and litert-torch take time that grows faster than linearly with it (measured on 2 shared
  cores: a chain of 1,000 ONNX Add nodes 66 s, of 3,000 nodes 281 s; 10,000 did not finish in 15 min);
* an ONNX file's nodes, every graph and function counted, before any pass over them: MAX_FILE_NODES
  (100,000; normalisation is linear in them).

No import beyond the standard library: both routes use it without the other's packages.
"""

from __future__ import annotations

import os

from optimize.core.shown import named as shown  # noqa: F401 - the one way a name from a file is shown

MAX_TENSOR_BYTES = 2**31
MAX_MODEL_BYTES = 2**31
MAX_NODES = 5_000
MAX_FILE_NODES = 100_000
NODES_ENV = "OPTIMIZE_MAX_NODES"
PROGRESS_NODES = 1_000  # from this size, each conversion step is said on screen (it takes minutes)


def max_nodes() -> int:
    """MAX_NODES, or the positive number the environment's OPTIMIZE_MAX_NODES gives."""
    raw = os.environ.get(NODES_ENV, "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else MAX_NODES
