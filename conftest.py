"""Root conftest: the plugin itself is loaded through its pytest11 entry point.

Nothing here on purpose: settings, fixtures and hooks come from pytest_kimiperf.plugin, so
that the perf suite runs the same whether this repository or an installed package provides it.
"""
