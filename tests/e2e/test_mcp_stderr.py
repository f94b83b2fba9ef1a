"""What a stdio MCP server writes to its stderr reaches the worker's log as structured
events naming the server, not as plain lines among the JSON ones."""

from __future__ import annotations

import json
import sys
from typing import Any

from tests.support.cluster import Cluster, assert_json_lines, wait_events, wait_ready

# The time server, after two lines on its stderr (one not valid UTF-8) and before it serves:
# both are written by the time its tools are listed.
NOISY_SERVER: dict[str, Any] = {
    "command": sys.executable,
    "args": [
        "-c",
        "import runpy, sys\n"
        "sys.stderr.buffer.write(b'noisy: starting up\\nnoisy: caf\\xe9 opened\\n'); sys.stderr.flush()\n"
        "sys.argv = ['mcp_server_time', '--local-timezone', 'UTC']\n"
        "runpy.run_module('mcp_server_time', run_name='__main__', alter_sys=True)\n",
    ],
}


def test_a_stdio_servers_stderr_is_logged_as_json_events_naming_the_server(cluster: Cluster) -> None:
    cluster.start_worker("w1", concurrency=1, env={"AIDAWORK_MCP_SERVERS": json.dumps({"noisy": NOISY_SERVER})})
    wait_ready(cluster, "w1")
    wait_events(cluster, "w1", "mcp_server_listed", count=1, server="noisy")

    assert_json_lines("w1", cluster.log_dir / "w1.log")
    logged = wait_events(cluster, "w1", "mcp_server_logged", count=2, server="noisy")
    assert [(e["stream"], e["line"]) for e in logged] == [
        ("stderr", "noisy: starting up"),
        ("stderr", "noisy: caf\ufffd opened"),
    ]
