"""Choosing: the decision tree before any measurement (`advice`), the default guard (`guard`), the measured,
noise-aware choice for a target and goals (`choose`) and why it is what it is (`explain`). Pure: no
TensorFlow, no runtime."""
