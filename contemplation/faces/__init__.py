"""What people and agents touch: the CLI, the MCP server, the dashboard, and what they share
(reading, actions, fork, the bearer token, the service)."""
