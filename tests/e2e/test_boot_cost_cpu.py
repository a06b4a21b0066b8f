"""Boot cost on the real CPU engine: two boots of tiny-cpu, the second from the compile cache.

Two real boots (about a minute each on two cores): the first with an empty compile cache, the
second reusing what the first wrote. Also the weight cache's fallback on this platform: the
engine's command line has no ``--load-format ipc_cache``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import MappingProxyType, SimpleNamespace

import pytest

from pytest_kimiperf.config.deployments import TINY_CPU
from pytest_kimiperf.config.nccl.profiles import NcclProfile
from pytest_kimiperf.server.manager import ServerManager



DEFAULT = NcclProfile("default", "NCCL's own choices", {})


def test_a_second_boot_reuses_the_compile_cache_and_its_compile_phase_is_shorter(
        tmp_path: Path, isolated_state: Path) -> None:
    pytest.importorskip("vllm")
    cache = tmp_path / "compile-cache"  # empty: the first boot compiles from scratch
    deployment = replace(TINY_CPU, env=MappingProxyType({
        **TINY_CPU.env, "VLLM_CACHE_ROOT": str(cache / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}))
    settings = SimpleNamespace(deployment=deployment, external=False, port=None, nccl_debug=False,
                               grace_s=10.0, host_wait_s=600.0, api_key=None, command_plans={}, control=False)
    said: list[str] = []
    manager = ServerManager(settings, log_dir=tmp_path / "logs", state_dir=isolated_state,  # type: ignore[arg-type]
                            say=said.append, on_progress=lambda *a: None)
    try:
        manager.acquire(DEFAULT)
        manager.release()
        manager.acquire(DEFAULT)
    finally:
        manager.close()
    first, second = manager.records["default"].accounts
    print("\n".join(a.summary() for a in (first, second)))
    print({a.ordinal: [(p.phase, p.seconds) for p in a.phases] for a in (first, second)})
    assert first.first_of_deployment and not second.first_of_deployment
    assert (first.phase_s("compiling") or 0) > (second.phase_s("compiling") or 0) > 0
    logs = [(tmp_path / "logs" / name).read_text() for name in
            ("server-tiny-cpu-default.log", "server-tiny-cpu-default-boot2.log")]
    assert not any("Compiling model again due to a load failure" in log for log in logs)
    # The weight cache cannot serve a CPU engine: no daemons, and the engine loads from disk.
    assert manager.weight_cache is not None and not manager.weight_cache.enabled
    assert "UnsupportedPlatformForIPCError" in (manager.weight_cache.fallback_reason or "")
    assert "ipc_cache" not in logs[1] and second.weights_source == "disk"
