"""The conversion stage: every route from a user's model to one float .tflite, and what that conversion cost.
`front` is the door every command goes through (open the model, or the built-in `demo` when none is given;
convert it if it is PyTorch or ONNX; read the data and check both); `keras` exports Keras / SavedModel models
and runs the TFLite converter (the `convert` technique: the float32 baseline, straight from the loaded model
where it can, and the converter's own schemes). `formats` says which format a model is and gives its object:
`.onnx`, `.pt2` and nn.Module models (`onnx_file`, `pt2_file`, `torch_module`) take one route to a float
.tflite, `torch_route` (the input `plan`, `torch_export` for torch.export and litert-torch, the `conversions`
cache), ONNX through `onnx_graph`'s normalisation and `onnx_ops`' export-friendly onnx2torch converters,
checked first by `onnx_checks`, untrusted PyTorch files read with `pt2_checks` and `torch_files`; `fidelity`
measures the float .tflite against the source runtime. Above `models` (what a model
is, how it is opened) and `measure`; below `transforms` (what is done to a float .tflite or a Keras model)."""
