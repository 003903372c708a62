"""A turn, from a message to its reply: the pipeline, turns, retries, need answers, the runtime's
slots and breakers, the background probes of a resting provider."""
