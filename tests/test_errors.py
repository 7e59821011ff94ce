"""The exception tree: bases, payloads and messages."""

from __future__ import annotations

import pytest

from envrunners.errors import (
    CliError,
    CompressionError,
    ConfigError,
    EnvCreatorError,
    EnvRunnerError,
    EnvRunnersError,
    FrozenConfigError,
    MultiAgentEnvError,
    OfflineDataError,
    OfflineInputNotFoundError,
    PickleNotAllowedError,
    SpaceError,
    UnencodableValueError,
    UnknownPolicyError,
    suggest,
)


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (ConfigError, ValueError),
        (FrozenConfigError, ConfigError),
        (FrozenConfigError, AttributeError),
        (EnvCreatorError, TypeError),
        (UnknownPolicyError, KeyError),
        (OfflineDataError, ValueError),
        (EnvRunnerError, RuntimeError),
        (SpaceError, ValueError),
        (MultiAgentEnvError, ValueError),
        (OfflineInputNotFoundError, OfflineDataError),
        (OfflineInputNotFoundError, FileNotFoundError),
        (UnencodableValueError, OfflineDataError),
        (UnencodableValueError, TypeError),
        (PickleNotAllowedError, OfflineDataError),
        (CompressionError, ValueError),
        (CliError, Exception),
    ],
)
def test_bases(cls, builtin):
    assert issubclass(cls, EnvRunnersError) and issubclass(cls, builtin)


def test_suggest():
    assert suggest("num_env_runner", ["num_env_runners", "seed"]) == (
        " Did you mean 'num_env_runners'?"
    )
    assert suggest("zzz", ["num_env_runners"]) == ""
    assert "one of" in suggest("policy", ["policy_a", "policy_b", "policyz"])


def test_config_error_lists_every_problem():
    err = ConfigError(problems=["a is bad", "b is bad"])
    assert err.problems == ["a is bad", "b is bad"]
    assert str(err) == "2 problems in the config:\n  - a is bad\n  - b is bad"
    assert str(ConfigError("just one")) == "just one"


def test_offline_error_names_path_and_line():
    err = OfflineDataError("not JSON", path="/data/x.json", line=7)
    assert str(err) == "/data/x.json:7: not JSON"
    assert (err.path, err.line) == ("/data/x.json", 7)
    assert str(OfflineDataError("missing", path="/d")) == "/d: missing"


def test_env_runner_error_carries_index_and_traceback():
    err = EnvRunnerError("died", runner_index=3, remote_traceback="Traceback ...")
    assert err.runner_index == 3
    assert str(err).startswith("env runner 3: died")
    assert "Remote traceback:\nTraceback ..." in str(err)


def test_unknown_policy_error_prints_plainly():
    err = UnknownPolicyError("policy 'p9' unknown; known: ['p0']")
    assert str(err) == "policy 'p9' unknown; known: ['p0']"


def test_cli_error_defaults_to_the_usage_exit_code():
    assert CliError("bad flag").code == 2
    assert CliError("it broke", 1).code == 1
    assert str(CliError("bad flag")) == "bad flag"
