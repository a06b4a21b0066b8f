"""The roofline: the ceiling a model and its hardware set on single-stream decode.

Which module holds what: docs/explanation/architecture.md (the one module map).
"""
