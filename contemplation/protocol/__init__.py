"""Pure: the log's grammar (framing, parsing), what a conversation needs next, structured answers
and their schemas, pages. No file is read or written here."""
