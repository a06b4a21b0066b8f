"""The package's one version: pyproject.toml reads it at build time, the package root re-exports
it, and the tiny engines report it. It imports nothing, so any layer may take it from here
without importing the root, which names every layer above it."""

__version__ = "0.1.0"
