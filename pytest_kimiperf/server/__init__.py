"""The server: one vLLM process from launch to the last leftover process.

Which module holds what: docs/architecture.md (the one module map).
"""
