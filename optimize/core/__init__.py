"""The bottom layer, imported by everything and importing nothing of optimize: the vocabulary, the errors,
the typed records (candidate, study), recipes and the technique registry, and the one reader and writer of
files. Pure Python: no TensorFlow, no LiteRT."""
