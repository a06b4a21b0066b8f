"""The session's reports: terminal summary, JSON, Markdown, plots and exports.

All of them show the same facts, gathered once into a :class:`~.model.SessionReport` (plain data,
no pytest): ``model`` gathers and compares, ``terminal`` (with its ``terminal_layout`` and
``terminal_context`` sections) and ``markdown`` lay the same table cells out for a terminal or for
GitHub, ``json_report`` builds the machine-readable report, ``plots`` draws PNGs and ``export``
writes per-request data. ``header`` is the report header's text, ``nccl_check`` says whether a
profile's NCCL settings were applied, ``benchmark_bridge`` feeds pytest-benchmark.
:class:`~.reporter.SessionReporter` (the role junitxml's ``LogXML`` plays) owns the session's
results, worker records and output errors and writes all of this at session end.
May import every lower package (``config``, ``server``, ``measure``, ``judge``, ``roofline``) and
the base modules; nothing below imports it. The package imports nothing itself: the report header
(``header``) is read by runs without perf tests, which must not load numpy or scipy.
"""
