"""The click CLI: one module a command group; ``root`` is the entry point."""
