"""Measuring a .tflite in the LiteRT runtime: size, accuracy and fidelity (`metrics`), latency timed
round-robin with noise-aware comparisons (`timing`, `noise`), peak memory (`memory`), the robustness probe
(`probe`), what an artifact holds (`verify`), intermediate tensors (`tensors`) and per-layer quantization
error (`layer_error`)."""
