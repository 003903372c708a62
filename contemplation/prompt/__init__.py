"""What is sent to the model: context, the system prompt, the history's budget, summaries."""
