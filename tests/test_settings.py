"""Settings: one place, strict parsing, one clear line naming a bad setting."""

from __future__ import annotations

import argparse

import pytest

from sibylla.cli import main
from sibylla.settings import (
    Settings,
    SettingsError,
    add_settings_arguments,
    settings_from_args,
)
from sibylla.streams.topics import changelog_topic


def test_environment_variables_are_typed() -> None:
    s = Settings.from_env({"SIBYLLA_PARTITIONS": "8", "SIBYLLA_GRACE_PERIOD_S": "0.5",
                           "SIBYLLA_STORE": "memory", "SIBYLLA_SECURITY_PROTOCOL": "sasl_ssl",
                           "SIBYLLA_SASL_USERNAME": "svc", "SIBYLLA_SASL_PASSWORD": "hunter2"})
    assert (s.partitions, s.grace_period_s, s.store) == (8, 0.5, "memory")
    assert s.security_protocol == "SASL_SSL"
    assert s.redacted()["sasl_password"] == "***"
    assert s.topic("decisions") == "sibylla.decisions"


@pytest.mark.parametrize(("env", "named"), [
    ({"SIBYLLA_PARTITIONS": "four"}, "SIBYLLA_PARTITIONS"),
    ({"SIBYLLA_PARTITIONS": "0"}, "partitions"),
    ({"SIBYLLA_STORE": "redis"}, "SIBYLLA_STORE"),
    ({"SIBYLLA_MIN_CONFIDENCE": "1.5"}, "min_confidence"),
    ({"SIBYLLA_EXPLORE_RATE": "1.5"}, "explore_rate=1.5: must be <= 1"),
    ({"SIBYLLA_EXPLORE_RATE": "-0.1"}, "explore_rate=-0.1: must be >= 0"),
    ({"SIBYLLA_EXPLORE_RATE": "nan"}, "explore_rate=nan: must be a number"),
    ({"SIBYLLA_EXPLORE_MAX_CONFIDENCE": "2"}, "explore_max_confidence=2.0: must be <= 1"),
    ({"SIBYLLA_EXPLORE_RATE": "ten percent"}, "SIBYLLA_EXPLORE_RATE"),
    ({"SIBYLLA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}, "sasl_username"),
])
def test_a_bad_value_names_the_setting(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        Settings.from_env(env)


def test_exploration_is_off_by_default_and_set_by_variable_or_flag() -> None:
    assert Settings.from_env({}).explore_rate == 0.0
    assert Settings.from_env({"SIBYLLA_EXPLORE_RATE": "0.05"}).explore_rate == 0.05
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    args = parser.parse_args(["--explore-rate", "0.2"])
    assert settings_from_args(args, env={"SIBYLLA_EXPLORE_RATE": "0.05"}).explore_rate == 0.2
    shown = " ".join(parser.format_help().split())
    assert "--explore-rate" in shown and "rightly stopped jobs one more failing run" in shown


def test_round_trip_through_child_process_environment() -> None:
    s = Settings.from_env({}, partitions="6", topic_prefix="x.", web_port="0",
                          explore_rate="0.1")
    assert Settings.from_env(s.to_env()) == s


def test_the_cli_stops_with_one_line_on_a_bad_setting(capsys, monkeypatch) -> None:
    monkeypatch.setenv("SIBYLLA_BATCH_MAX_WINDOWS", "-3")
    assert main(["worker", "--bootstrap-servers", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "batch_max_windows" in err[0]


def test_a_deployment_with_its_own_topic_prefix_gets_its_own_groups() -> None:
    """A second Slurm cluster on the same Kafka repeats the first one's job ids: with only
    its prefix changed, its workers joined the first one's group and shared its tables'
    changelogs (``sibylla-windows-changelog``), and its actuator the first one's offsets."""
    first, second = Settings.from_env({}), Settings.from_env({"SIBYLLA_TOPIC_PREFIX": "gpu-b."})
    assert (first.group_id, first.slurm_actuator_group) == ("sibylla", "sibylla-slurm-actuator")
    assert (second.group_id, second.slurm_actuator_group) == ("gpu-b", "gpu-b-slurm-actuator")
    assert changelog_topic(second, "windows") == "gpu-b-windows-changelog"
    chosen = Settings.from_env({"SIBYLLA_TOPIC_PREFIX": "gpu-b.", "SIBYLLA_GROUP_ID": "w"})
    assert chosen.group_id == "w"
    assert Settings.from_env(second.to_env()) == second  # a child process keeps them
