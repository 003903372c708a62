"""contemplation: a folder that is an asynchronous conversation queue with local LLMs."""

__version__ = "0.1.0"
