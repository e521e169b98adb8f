"""ServerConfig validation, admin token resolution, config files and error lines that name the key."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from grpo_runtime.config import (
    ConfigError,
    MiB,
    ServerConfig,
    format_validation_error,
    load_config_file,
)


def test_defaults_are_local_and_generous_with_message_size():
    config = ServerConfig()
    assert config.host == "127.0.0.1"
    assert config.max_message_bytes == 64 * MiB
    assert config.metrics_port is None and config.max_concurrent_rpcs is None
    assert not config.tls_enabled
    assert ServerConfig(log_level="debug").log_level == "DEBUG"


def test_unknown_keys_and_bad_values_name_the_key():
    with pytest.raises(ValidationError) as error:
        ServerConfig.model_validate({"prot": 1, "grace_period_s": -1})
    line = format_validation_error(error.value, prefix="server")
    assert "server.prot: unknown key" in line
    assert "server.grace_period_s: Input should be greater than or equal to 0" in line


def test_tls_files_must_come_together(tmp_path):
    with pytest.raises(ValidationError, match="tls_cert_file and tls_key_file must be set together"):
        ServerConfig(tls_cert_file=tmp_path / "c.pem")
    with pytest.raises(ValidationError, match="mutual TLS"):
        ServerConfig(tls_client_ca_file=tmp_path / "ca.pem")
    assert ServerConfig(tls_cert_file=tmp_path / "c", tls_key_file=tmp_path / "k").tls_enabled


def test_admin_token_precedence_config_then_env_then_file(tmp_path, monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text("  from-file \n")
    monkeypatch.delenv("GRPO_ADMIN_TOKEN", raising=False)
    assert ServerConfig().resolve_admin_token() is None
    assert ServerConfig(admin_token_file=token_file).resolve_admin_token() == "from-file"
    monkeypatch.setenv("GRPO_ADMIN_TOKEN", "from-env")
    assert ServerConfig(admin_token_file=token_file).resolve_admin_token() == "from-env"
    assert ServerConfig(admin_token="direct", admin_token_file=token_file).resolve_admin_token() == "direct"


@pytest.mark.parametrize("blank", ["", "   ", "\n\t "])
def test_a_blank_admin_token_is_a_config_error_naming_its_source(tmp_path, monkeypatch, blank):
    monkeypatch.delenv("GRPO_ADMIN_TOKEN", raising=False)
    with pytest.raises(ConfigError, match=r"^server\.admin_token: the admin token is empty"):
        ServerConfig(admin_token=blank).resolve_admin_token()
    token_file = tmp_path / "token"
    token_file.write_text(blank)
    with pytest.raises(ConfigError, match=r"^server\.admin_token_file \(.*token\): the admin token is empty"):
        ServerConfig(admin_token_file=token_file).resolve_admin_token()
    monkeypatch.setenv("GRPO_ADMIN_TOKEN", blank)
    # A blank variable does not fall back to the file either: it is refused.
    token_file.write_text("from-file")
    with pytest.raises(ConfigError, match=r"^env GRPO_ADMIN_TOKEN: the admin token is empty"):
        ServerConfig(admin_token_file=token_file).resolve_admin_token()


def test_unreadable_token_file_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.delenv("GRPO_ADMIN_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="admin_token_file"):
        ServerConfig(admin_token_file=tmp_path / "missing").resolve_admin_token()


def test_token_is_not_shown_in_the_config_repr():
    assert "hunter2" not in repr(ServerConfig(admin_token="hunter2"))


class _Lora(BaseModel):
    model_config = ConfigDict(extra="forbid")
    r: int


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora: _Lora
    rewards: list[_Lora] = []


def test_error_keys_are_dotted_with_list_indices():
    with pytest.raises(ValidationError) as error:
        _Settings.model_validate({"lora": {"r": "x"}, "rewards": [{"r": 1}, {"r": 2, "q": 0}]})
    line = format_validation_error(error.value)
    assert "lora.r: Input should be a valid integer" in line
    assert "rewards[1].q: unknown key" in line
    assert "\n" not in line


def test_config_file_splits_the_server_block_from_the_settings(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  port: 1234\nmodel: /m\n")
    assert load_config_file(path) == ({"port": 1234}, {"model": "/m"})
    path.write_text("")
    assert load_config_file(path) == ({}, {})
    path.write_text("server: 3\n")
    with pytest.raises(ConfigError, match="server: must be a mapping"):
        load_config_file(path)
