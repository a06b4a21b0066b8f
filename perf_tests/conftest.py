"""Configuration of the perf suite.

Deployments and NCCL profiles for this suite can be added here with the plugin's hooks
(``pytest_kimiperf_add_deployments``, ``pytest_kimiperf_add_profiles``) as well as in
``pyproject.toml`` under ``[tool.kimiperf]``.
"""
