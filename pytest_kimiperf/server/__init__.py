"""The server: one vLLM process from launch to the last leftover process.

Which module holds what: docs/explanation/architecture.md (the one module map).
"""
