"""Toolsets: tools that come from outside the code, registered at process start next to
the built-ins (``runtime.toolsets.mcp``: the tools of MCP servers)."""
