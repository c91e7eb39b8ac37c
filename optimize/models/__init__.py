"""The front door's first half: what a model is and how it is opened. Keras 2/3, SavedModel and .tflite
recognised (`source`; what an opened model is: `spec`), foreign flatbuffers read, validated and normalised to
plain float32 (`flatbuffer`, `validate`, `tflite`, `normalize`), Keras 3 rebuilt in tf_keras (`rebuild`),
data sets and what their labels mean (`data`, `tasks`), the data checked against the model (`inputs`), the
LiteRT interpreter (`runtime`) and model facts (`weights`, `facts`, `known`). Turning a model into a float
.tflite is the next stage up: `optimize.convert`."""
