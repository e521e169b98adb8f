"""The gateway block of the rollout settings and its command-line flag."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from rollout_service.server import add_arguments, settings_from


def parse(argv, config=None):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from(parser.parse_args(argv), config or {})


def test_the_gateway_is_off_by_default_and_the_flag_sets_its_port():
    assert parse(["--model", "m"]).gateway.port is None
    settings = parse(["--model", "m", "--openai-port", "8123"], {"gateway": {"max_n": 3}})
    assert (settings.gateway.port, settings.gateway.max_n, settings.gateway.serve_without_session) == (
        8123,
        3,
        True,
    )


def test_unknown_gateway_keys_are_errors_naming_them():
    with pytest.raises(ValidationError, match=r"gateway\.max_choices"):
        parse(["--model", "m"], {"gateway": {"max_choices": 3}})
