"""An attached server's hardware, stated once in the repository: the ini setting or the deployment
table's ``server_hardware``, so a CI job and a laptop state it alike; the option and its variable
still win, by the precedence every option has (command line > environment > ini > the table)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kimiperf.config.options import OPTIONS, read_raw_options
from pytest_kimiperf.config.settings import RawOption, build_settings
from pytest_kimiperf.errors import ConfigError
from tests.unit.test_serve_args import _options

TABLE = """
[tool.kimiperf.deployments.remote]
server_hardware = "1x  test box"
restart_command = ["true"]
"""
URL = RawOption("http://127.0.0.1:9", "command line --kimiperf-server-url")


def _settings(tmp_path: Path, table: str = TABLE, **raw: RawOption):  # type: ignore[no-untyped-def]
    (tmp_path / "pyproject.toml").write_text(table)
    return build_settings({**_options("remote", "default"), "server_url": URL, **raw}, rootpath=tmp_path)


def test_the_deployment_table_states_the_attached_servers_hardware(tmp_path: Path) -> None:
    assert _settings(tmp_path).server_hardware == "1x test box"  # whitespace as the option's
    # ... so recording needs no flag: the repository says what the baseline was measured on.
    update = RawOption(True, "command line --kimiperf-update-baselines")
    assert _settings(tmp_path, update_baselines=update).server_hardware == "1x test box"


@pytest.mark.parametrize(("source", "value"), [("command line --kimiperf-server-hardware", "from the flag"),
                                               ("environment variable KIMIPERF_SERVER_HARDWARE", "from the env"),
                                               ("ini option kimiperf_server_hardware", "from the ini")])
def test_the_option_its_variable_and_its_ini_setting_win_over_the_table(tmp_path: Path, source: str,
                                                                        value: str) -> None:
    assert _settings(tmp_path, server_hardware=RawOption(value, source)).server_hardware == value


def test_the_variable_sits_between_the_command_line_and_the_ini_setting() -> None:
    opt = next(o for o in OPTIONS if o.name == "server_hardware")
    assert (opt.env, opt.ini) == ("KIMIPERF_SERVER_HARDWARE", "kimiperf_server_hardware")
    ini = {"kimiperf_server_hardware": "ini box"}
    raw = read_raw_options(lambda dest: None, ini.get, {"KIMIPERF_SERVER_HARDWARE": "env box"})
    assert (raw["server_hardware"].value, raw["server_hardware"].source) == (
        "env box", "environment variable KIMIPERF_SERVER_HARDWARE")
    assert read_raw_options(lambda dest: None, ini.get, {})["server_hardware"].value == "ini box"


def test_a_booted_server_ignores_it_its_hardware_is_probed(tmp_path: Path) -> None:
    table = TABLE + 'model = "m"\ncommand = ["vllm", "serve", "{model}", "--port", "{port}"]\n'
    assert _settings(tmp_path, table, server_url=RawOption(None, "default")).server_hardware is None


@pytest.mark.parametrize(("value", "words"), [('""', "server_hardware is empty"),
                                              ("8", "server_hardware = 8 has the wrong type; expected a string")])
def test_a_bad_table_value_is_a_config_error_naming_the_key(tmp_path: Path, value: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        _settings(tmp_path, f"[tool.kimiperf.deployments.remote]\nserver_hardware = {value}\n")


def test_recording_without_it_says_where_to_state_it_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="once for every run in the repository: the kimiperf_server_hardware ini "
                                          "option or the deployment's server_hardware"):
        _settings(tmp_path, "[tool.kimiperf.deployments.remote]\n",
                  update_baselines=RawOption(True, "command line --kimiperf-update-baselines"))
