"""Configuration: what the user asked for, read and validated once.

Owns the option table and its ini twins (``options``), the frozen :class:`Settings` built from
them (``settings``), the deployments (how to start a server and how to judge it), the NCCL
profiles (``nccl/``), what each metric is (``metric_specs``) and the name rules for anything that
becomes part of a file path (``names``). Imports only the package's base modules (``errors``,
``paths``); every other package may import this one.
"""
