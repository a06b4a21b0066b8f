"""NCCL profiles: the named environment overrides a server is booted with.

Which module holds what: docs/architecture.md (the one module map).
"""
