"""The sqlite index of every log: rows, search, lists, retention."""
