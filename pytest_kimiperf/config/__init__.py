"""Configuration: what the user asked for, read and validated once.

Owns the option table and its ini twins (``options``), the frozen :class:`Settings` built from
them (``settings``), the deployments (how to start a server and how to judge it: the built-in
ones in ``deployments``, the user's tables read in ``deployment_tables``), the NCCL profiles
(``nccl/``), what each metric is (``metric_specs``), the bounds a deployment sets on a
measurement (``measure_bounds``), the server URL and endpoint checked once (``server_url``) and
the rules for names the user gives, with the hint for a misspelled one (``names``). Imports
only the package's base modules (``errors``, ``paths``); every other package may import this one.
"""
