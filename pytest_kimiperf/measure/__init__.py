"""Measurement: play a load pattern against a server and time every token.

Owns the streaming client (``client``, over ``connection``'s kernel-stamped HTTP/1.1 and
``sse``'s event splitting; ``client_https`` for TLS), requests of an exact shape (``workload``),
the public scenario dataclasses (``scenarios``) and the runner that plays them (``runner``,
which deals requests out with ``planning`` and runs each client process's loop with
``engine``), one request's timeline (``records``) and the run's figures computed from them
(``results``), the server's own ``/metrics`` view (``server_view``), the target a run is aimed
at (``target``) and the watch on what else used the host (``hostwatch``, reading it through
``host_readings``). May import ``config``, ``server`` and the base modules; it measures and
never judges.
"""
