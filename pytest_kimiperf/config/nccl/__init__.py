"""NCCL profiles: the named environment overrides a server is booted with.

``profiles`` holds the built-in and user-defined profiles and turns them into a server's
environment; ``values`` the rules each NCCL_*/CUDA_* value must follow (from NCCL's own parser);
``debug_log`` reads what an ``NCCL_DEBUG=INFO`` log says was applied. Imports only ``config``'s
``names`` and the base modules.
"""
