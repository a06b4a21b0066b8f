"""The server: one vLLM process from launch to the last leftover process.

Owns a server process (``process``: launch, readiness, death, stop), the session's servers one
at a time (``manager``), the record of each launch (``launch_records``), the sweep that finds
and ends every process we launched (``sweep``, ``launcher``), boot progress and its account
(``progress``, ``boot_account``), the host claim (``host_claim``), GPU queries (``gpu``), what
nvidia-smi prints (``nvidia_smi``), whether this host can run a deployment
(``hardware_check``), the weight-cache daemons (``weight_cache``), the tiny CPU model
(``tiny_model``) and reading the server's JSON answers (``http_json``).
May import ``config`` and the base modules; never ``measure``, ``judge`` or ``reports``.
"""
