"""The home, read side: its layout, the log as segments and cursors, templates, attachments, and
what a conversation is doing or waiting for."""
