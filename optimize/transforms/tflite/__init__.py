"""tflite-stage techniques: a float32 .tflite in, a quantized (or rescued float) .tflite out."""
