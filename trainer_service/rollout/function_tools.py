"""``training.tools.functions`` against an environment service this run did not start.

The reward service imports code only from its own settings, so a run cannot hand it functions: a service
the trainer spawns gets them written into its settings; any other must already offer them, as the
environment ``tools`` of kind ``functions`` whose ListEnvironments status names exactly these import paths
(``functions a:f, b:g``, in order). Otherwise the run is refused before training starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from grpo_runtime.client import ChannelConfig
from grpo_runtime.config import ConfigError
from grpo_runtime.env_client import EnvironmentClient
from grpo_runtime.env_types import EnvironmentInfo
from trainer_service.config.tools import TOOLS_ENVIRONMENT


def functions_status(import_paths: Sequence[str]) -> str:
    """The ListEnvironments status of a functions environment serving ``import_paths``."""
    return "functions " + ", ".join(import_paths)


def serves_tools(environments: Sequence[EnvironmentInfo], import_paths: Sequence[str]) -> bool:
    """Whether the listed environments include exactly ``import_paths`` as the ``tools`` environment."""
    return any(
        e.name == TOOLS_ENVIRONMENT
        and e.kind == "functions"
        and e.available
        and e.status == functions_status(import_paths)
        for e in environments
    )


async def _list(target: ChannelConfig, timeout_s: float) -> list[EnvironmentInfo]:
    async with EnvironmentClient(target, timeout_s=timeout_s) as client:
        return await client.list_environments()


def check_served_tools(import_paths: Sequence[str], target: ChannelConfig, timeout_s: float) -> None:
    """ConfigError naming ``training.tools.functions`` unless ``target`` serves exactly these functions."""
    if serves_tools(asyncio.run(_list(target, timeout_s)), import_paths):
        return
    raise ConfigError(
        f"the environment service at {target.target} does not serve these functions, and a remote reward "
        "service imports code only from its own settings: list them there as environments.functions."
        f"{TOOLS_ENVIRONMENT}: {list(import_paths)}, or leave services.reward unset so that the trainer "
        "starts one with them",
        key="training.tools.functions",
    )
