"""The only code that writes under the home.

* :mod:`.files` — atomic file replacement and the flocks (conversation, daemon);
* :mod:`.folders` — creating conversations, the inbox (drop, claim, reject), archive, flags;
* :mod:`.session` — :func:`open_writer`: appends, state, rotation and crash recovery under the
  conversation's lock;
* :mod:`.reply` — a reply streamed into the log as it arrives, and its durable stream
  (:class:`~.reply.LiveReply`: journaled, held, merged, committed).

People who append by hand take the same lock:
``flock <conv>/.lock -c 'cat msg >> <conv>/messages.log'``.
"""

from typing import TYPE_CHECKING, Any

from contemplation.writer.files import (
    DaemonLock,
    atomic_write_bytes,
    atomic_write_json,
    conv_lock,
    daemon_alive,
    faces_lock,
    fsync_dir,
    now_iso,
)

if TYPE_CHECKING:  # loaded when first asked for (below): a reader that only asks
    # daemon_alive or faces_lock loads neither the turn's writers, nor the folders' (their
    # templates and ladders), nor the models (pydantic)
    from contemplation.writer.folders import (
        archive,
        claim,
        clear_cancel,
        delete_archived,
        drop_message,
        ensure_conversation_files,
        ensure_home,
        finish_deletions,
        idempotent_create,
        new_conversation,
        probe_writable,
        reject_input,
        remove_tmp_files,
        request_cancel,
        unarchive,
        unclaim,
        write_context_file,
        write_metadata,
    )
    from contemplation.writer.reply import LiveReply, ReplyStream, Streamed
    from contemplation.writer.session import ConvWriter, open_writer, rebuild_state

_LATER = {  # name -> the module that holds it
    **dict.fromkeys(
        (
            "archive", "claim", "clear_cancel", "delete_archived", "drop_message",
            "ensure_conversation_files", "ensure_home", "finish_deletions", "idempotent_create",
            "new_conversation", "probe_writable", "reject_input", "remove_tmp_files",
            "request_cancel", "unarchive", "unclaim", "write_context_file", "write_metadata",
        ),
        "folders",
    ),
    **dict.fromkeys(("LiveReply", "ReplyStream", "Streamed"), "reply"),
    **dict.fromkeys(("ConvWriter", "open_writer", "rebuild_state"), "session"),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _LATER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{_LATER[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ConvWriter",
    "DaemonLock",
    "LiveReply",
    "ReplyStream",
    "Streamed",
    "archive",
    "atomic_write_bytes",
    "atomic_write_json",
    "claim",
    "clear_cancel",
    "conv_lock",
    "daemon_alive",
    "delete_archived",
    "drop_message",
    "ensure_conversation_files",
    "ensure_home",
    "faces_lock",
    "finish_deletions",
    "fsync_dir",
    "idempotent_create",
    "new_conversation",
    "now_iso",
    "open_writer",
    "probe_writable",
    "rebuild_state",
    "reject_input",
    "remove_tmp_files",
    "request_cancel",
    "unarchive",
    "unclaim",
    "write_context_file",
    "write_metadata",
]
