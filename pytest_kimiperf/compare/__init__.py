"""``kimiperf compare``: the plugin's verdict over result files other tools already wrote.

One small reader per format (``read_*``), each turning a file into :class:`runs.ToolRun` values or
raising :class:`runs.ResultFileError` that names the file and the field; ``verdict`` judges groups
of runs with the profile comparison's rule (judge/profiles.py), ``render`` writes the answer, and
``cli`` is the command line.
"""
