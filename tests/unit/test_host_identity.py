"""Which host a session ran on: a reboot is a session of the same host where the machine can say
so, and a runner can name itself (issue 34)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kimiperf.config.settings import RawOption
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.measure.canary import PRODUCT_UUID, host_identity
from pytest_kimiperf.reports.header import host_line
from tests.unit.test_gate_switch import _settings


def _reader(files: dict[str, str]):  # type: ignore[no-untyped-def]
    return lambda path: files.get(path, "")


MACHINE = "3d1219c7c4c5aa0011223344556677"


def test_with_the_product_uuid_a_reboot_is_the_same_host_and_a_clone_another() -> None:
    before = host_identity(read=_reader({"/etc/machine-id": MACHINE, "/proc/sys/kernel/random/boot_id": "boot-1",
                                         PRODUCT_UUID: "4C4C4544-0001"}))
    rebooted = host_identity(read=_reader({"/etc/machine-id": MACHINE, "/proc/sys/kernel/random/boot_id": "boot-2",
                                           PRODUCT_UUID: "4c4c4544-0001"}))
    clone = host_identity(read=_reader({"/etc/machine-id": MACHINE, "/proc/sys/kernel/random/boot_id": "boot-1",
                                        PRODUCT_UUID: "4C4C4544-0002"}))
    assert before["basis"] == "machine-id+product-uuid"
    assert rebooted["host"] == before["host"], "a reboot keeps the host"
    assert clone["host"] != before["host"], "a clone of the VM image that shares the machine id is another host"


def test_without_the_uuid_the_boot_id_stays_in_the_host_as_before() -> None:
    # The machines of this project's CI are clones sharing one machine id (benchmarks/data/noise:
    # four hosts, decode 146 to 1285 tok/s, machine id 3d1219c7c4c5): the boot id tells them apart.
    one = host_identity(read=_reader({"/etc/machine-id": MACHINE, "/proc/sys/kernel/random/boot_id": "boot-1"}))
    other = host_identity(read=_reader({"/etc/machine-id": MACHINE, "/proc/sys/kernel/random/boot_id": "boot-2"}))
    assert one["basis"] == "machine-id+boot-id" and one["host"] != other["host"]
    assert "a reboot counts as another host" in host_line(one) and "--kimiperf-host-id" in host_line(one)
    # the same hash as the corpus recorded before the UUID was read
    assert len(one["host"]) == 16 and one == host_identity(
        read=_reader({"/etc/machine-id": MACHINE, "/proc/sys/kernel/random/boot_id": "boot-1"}))


def test_a_declared_host_id_wins_over_any_machine_fact() -> None:
    ident = host_identity("gpu-runner-1", read=_reader({"/etc/machine-id": MACHINE, PRODUCT_UUID: "x"}))
    assert (ident["host"], ident["basis"]) == ("gpu-runner-1", "declared")
    assert host_line(ident) == "kimiperf: host id gpu-runner-1 (declared)"


def test_the_host_id_option_is_checked_once(tmp_path: Path) -> None:
    assert _settings(tmp_path).host_id is None
    s = _settings(tmp_path, host_id=RawOption("gpu-runner-1", "environment variable KIMIPERF_HOST_ID"))
    assert s.host_id == "gpu-runner-1"
    with pytest.raises(ConfigError, match=r"host id 'gpu runner' \(from ini option kimiperf_host_id\): use 1-128"):
        _settings(tmp_path, host_id=RawOption("gpu runner", "ini option kimiperf_host_id"))


def test_this_machine_gets_a_stable_id() -> None:
    ident = host_identity()
    assert ident == host_identity() and ident["basis"] in ("machine-id+product-uuid", "machine-id+boot-id")
