"""The roofline: the ceiling a model and its hardware set on single-stream decode.

Owns the model's ``config.json``, found and read (``model_config``), the weight formats a
checkpoint's quantization config describes (``quantization``), the bytes a decoded token reads
(``weights``), the ceiling itself with the hardware's bandwidth and latency (``ceiling``: pure
arithmetic), and gathers the session's inputs for the report (``inputs``).
May import ``config``, ``server`` (GPU facts), ``judge`` (results) and the base modules.
"""
