"""The perf suite, a package so its tests import their workloads the same way under every
pytest import mode (``prepend``, the default, and ``importlib``, recommended for new projects):
``from .workloads import ...``. Copy the folder, this file included, as a template."""
