"""pytest-kimiperf: LLM-serving benchmarks (vLLM) as performance tests.

The plugin itself is wired in :mod:`pytest_kimiperf.plugin`; every other module holds one
piece of logic and, apart from a few fixtures' helpers, does not import pytest.
"""

__version__ = "0.1.0"
