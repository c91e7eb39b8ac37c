"""Every technique, by stage, and what only techniques use. `keras/`: prune, cluster, QAT (Keras -> Keras);
`convert`: Keras/SavedModel -> .tflite; `tflite/`: a float .tflite -> a quantized or rescued one (LiteRT
Quantizer, the TFLite calibrator, the selective search, equalization, bias correction, learned rounding,
activation ranges). Each technique module registers itself (`optimize.core.registry`)."""
