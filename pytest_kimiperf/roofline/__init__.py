"""The roofline: the ceiling a model and its hardware set on single-stream decode.

Owns weight quantization and accounting and the ceiling itself (pure arithmetic on a model's
config and the GPU's bandwidth), and gathers the session's inputs for the report (``inputs``).
May import ``config``, ``server`` (GPU facts), ``judge`` (results) and the base modules.
"""
