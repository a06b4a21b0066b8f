"""Measurement: play a load pattern against a server and time every token.

Owns the streaming client (``client``, ``client_https``), requests of an exact shape
(``workload``), the public scenario dataclasses (``scenarios``) and the runner that plays them
(``runner``, which deals requests out with ``planning`` and runs each client process's loop with
``engine``), the run's figures computed from request timelines (``results``), the server's own
``/metrics`` view (``server_view``), the target a run is aimed at (``target``) and the watch on
what else used the host (``hostwatch``). May import ``config``, ``server`` and the base modules;
it measures and never judges.
"""
