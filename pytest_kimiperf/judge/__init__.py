"""Judgement: is this build's figure a real change or noise, and does the test pass?

Owns one boot's figure (``boot_summary``), the statistics across boots (``stats``), the one
place a verdict is decided (``gate.judge``), the result types (``results``), floors and targets
(``floors``), how many boots a verdict needs (``planning``), the baselines, read and written
(``baselines``; the file format is ``baseline_schema``), the hardware fingerprint that says which
baseline applies (``fingerprint``), the schedule of boots (``boots``) and the boot planner's
command line (``planner``). May import ``config``, ``server`` (GPU facts for the fingerprint),
``measure`` (run results) and the base modules; it starts nothing and sends no request.
"""
