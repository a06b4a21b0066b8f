"""Configuration: what the user asked for, read and validated once.

Which module holds what: docs/explanation/architecture.md (the one module map).
"""
