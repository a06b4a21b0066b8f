"""``--kimiperf-control``: the recorded build booted beside the candidate, checked before any boot.

The control is the selected profile served by the deployment's ``control_command``
(config/nccl/profiles.control_profile); the comparison is judge/profiles.compare_with_control.
"""

from __future__ import annotations

from pytest_kimiperf.config.deployments import Deployment
from pytest_kimiperf.config.nccl.profiles import NcclProfile
from pytest_kimiperf.errors import ConfigError


def check_control(value: object, source: str, deployment: Deployment, profiles: tuple[NcclProfile, ...], *,
                  server_url: str | None, update: bool) -> bool:
    """--kimiperf-control (its ``value``, and the ``source`` it came from), checked against what it
    needs: a control_command, a deployment on one machine, one profile to judge against it, a
    server this run boots, and a run that judges (not one that records)."""
    if not bool(value):
        return False
    said = f"--kimiperf-control (from {source})"
    if not deployment.control_command:
        raise ConfigError(f"{said}: deployment {deployment.name} declares no control_command, the command that "
                          "serves the recorded build (the default branch's virtualenv or image); add it to "
                          f"[tool.kimiperf.deployments.{deployment.name}]")
    if server_url is not None:
        raise ConfigError(f"{said} with --kimiperf-server-url {server_url}: an attached server is one build, "
                          "and this run boots no control beside it; drop one of the two")
    if not any("{port}" in part for part in deployment.control_command):
        raise ConfigError(f"{said}: deployment {deployment.name}'s control_command "
                          f"{list(deployment.control_command)!r} has no {{port}}: the control would listen where "
                          "the plugin never looks; pass the server's port option with '{port}'")
    if deployment.nodes:
        raise ConfigError(f"{said}: deployment {deployment.name} spans {len(deployment.nodes)} nodes, whose other "
                          "nodes start the deployment's own command; a control across nodes is not supported")
    if len(profiles) != 1:
        raise ConfigError(f"{said} judges one profile against its control; select one with --kimiperf-profile, "
                          f"not {', '.join(p.name for p in profiles)}")
    if update:
        raise ConfigError(f"{said} with --kimiperf-update-baselines: the control is the recorded build, not one to "
                          "record; record without --kimiperf-control")
    return True
