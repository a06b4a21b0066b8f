"""``kimiperf compare``: the plugin's verdict over result files other tools already wrote."""
