"""The session's reports: terminal summary, JSON, Markdown, plots and exports.

The package imports nothing itself: the report header (``header``) is read by runs without perf
tests, which must not load numpy or scipy. Which module holds what: docs/explanation/architecture.md (the
one module map).
"""
