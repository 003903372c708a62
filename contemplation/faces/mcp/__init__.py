"""The MCP server: the SDK wiring, the tools' bodies, arguments, subscriptions."""
