"""The front door: what a model is and how it is opened. Keras 2/3, SavedModel and .tflite recognised
(`source`), foreign flatbuffers read, validated and normalised to plain float32 (`flatbuffer`, `validate`,
`tflite`, `normalize`), Keras 3 rebuilt in tf_keras (`rebuild`), data sets and what their labels mean
(`data`, `tasks`), the LiteRT interpreter (`runtime`), model facts (`weights`) and the built-in demo."""
