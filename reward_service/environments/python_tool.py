"""``python``: a tool that runs the model's code in the code sandbox, with state kept across the calls of one
episode.

Each call is one fresh sandbox run (``reward_service.sandbox``: no network, no secrets, a throw-away
filesystem, time/memory/output limits) of ``python_cells.py``, which replays the episode's earlier cells with
their output discarded and then runs the new one. So variables, functions and imports persist as in a
notebook, while no process outlives a call and nothing of one episode can reach another. Replay is exact for
deterministic code; cells using randomness or the clock see fresh values. A cell that was killed (time,
memory or output limit) is not replayed. The episode's runs share one CPU budget
(``sandbox.max_cpu_s_per_request``), and the cells one episode may run are capped (``max_cells``) together
with their total size (``sandbox.max_program_bytes``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo_runtime.env_types import ToolDefinition
from reward_service.environments.base import ToolError
from reward_service.environments.settings import PythonSettings
from reward_service.sandbox.runner import RunSession, SandboxRunner

DRIVER = (Path(__file__).parent / "python_cells.py").read_text()
NO_OUTPUT = "(no output)"
# Exit status of the driver when the new cell raised (its traceback is on stdout).
CELL_RAISED = 1

TOOL = ToolDefinition(
    name="python",
    description="Runs Python code and returns what it prints, plus the value of a final expression. State "
    "(variables, functions, imports) is kept between calls. Standard library only; no network, no files "
    "outside the working directory.",
    parameters={
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The Python code to run."}},
        "required": ["code"],
    },
)


class PythonSession:
    """The cells of one episode and its sandbox session (its turn in the shared run slots and CPU budget)."""

    tools: tuple[ToolDefinition, ...] = (TOOL,)
    prompt_suffix = ""

    def __init__(self, runner: SandboxRunner, settings: PythonSettings):
        self._runner = runner
        self._settings = settings
        self._session: RunSession = runner.session()
        self._history: list[str] = []

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        code: str = arguments["code"]
        if len(self._history) >= self._settings.max_cells:
            raise ToolError(f"this episode has run its {self._settings.max_cells} cells (python.max_cells)")
        size = len(code.encode()) + sum(len(c.encode()) for c in self._history)
        limit = self._runner.settings.max_program_bytes
        if size > limit:
            raise ToolError(f"the episode's code would be {size} bytes, at most {limit}")
        result = await self._runner.run(
            DRIVER, json.dumps({"history": self._history, "cell": code}), self._session
        )
        output = result.stdout.rstrip("\n")
        if result.ok or result.exit_code == CELL_RAISED:
            self._history.append(code)
            if not result.ok:
                raise ToolError(output or "the code raised an exception")
            return output or NO_OUTPUT
        raise ToolError(f"{output}\n[{result.failure}]" if output else result.failure)

    async def reward(self) -> float | None:
        return None

    async def close(self) -> None:
        return None  # no process outlives a call


class PythonEnvironment:
    kind = "python"
    name = "python"

    def __init__(self, runner: SandboxRunner | None, settings: PythonSettings, sandbox_status: str):
        self._runner = runner
        self._settings = settings
        self.available = runner is not None
        self.status = sandbox_status
        self.description = (
            "A `python(code)` tool: sandboxed Python, state kept across the calls of an episode."
        )

    async def open(self, metadata: dict[str, Any]) -> PythonSession:
        assert self._runner is not None  # the registry refuses an unavailable environment
        return PythonSession(self._runner, self._settings)
