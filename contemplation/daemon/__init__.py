"""The running daemon: the composition root, the watcher, the dispatcher, notifications, the index
keeper."""
