"""A tiny MCP server over stdio (the MCP SDK's MCPServer, formerly FastMCP) for the environment tests.

python -m tests.support.mcp_server
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes")
notes: list[str] = []


@server.tool()
def add_note(text: str) -> str:
    """Stores a note for this session."""
    notes.append(text)
    return f"{len(notes)} notes"


@server.tool()
def list_notes() -> str:
    """Lists the notes stored in this session, one per line."""
    return "\n".join(notes)


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@server.tool()
def environment_variable(name: str) -> str:
    """The value of one of the server's environment variables (empty when unset)."""
    return os.environ.get(name, "")


@server.tool()
def crash() -> str:
    """Ends the server process at once, as a crashing server would."""
    os._exit(3)


if __name__ == "__main__":
    server.run()
