"""NCCL profiles: the named environment overrides a server is booted with.

Which module holds what: docs/explanation/architecture.md (the one module map).
"""
