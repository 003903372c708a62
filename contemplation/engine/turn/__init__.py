"""One model turn as one object: build the request, stream the reply into the log, record how
it went.

A turn runs under the lock and writer of the step that decided it (one lock, one read of the
state per step), held together in a :class:`~.state.Turn`. Its phases are a chain with no
circle: :mod:`.prepare` (the context requirements, gathered on the first turn only; what the
model can do), :mod:`.fit` (the history fitted to the model's window), a backend slot awaited
(queued per model), :mod:`.stream` (the reply streams into ``messages.log`` as it arrives)
and :mod:`.end`; a failure becomes a retry (transient) or a visible ERROR (permanent) in
:mod:`.retrying`. :mod:`.run` chains them. Native tool calls are written into the reply as
``NEED:`` lines under a ``(tool call …)`` line, so the ordinary answer cycle answers them.
"""
