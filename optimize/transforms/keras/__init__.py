"""Keras-stage techniques (tfmot, tf_keras): pruning, clustering and quantization-aware training."""
