"""The leaf toolbox, what every layer may use and that knows nothing of conversations: asyncio
helpers, exit codes, logging, plugin loading, private files, redaction, the clock for retries."""
