"""A configured provider as one object: its client, slots, breakers, slot affinity, KV files,
discovered limits and capabilities together (:class:`~.provider.Provider`).

The runtime holds one mapping of them, made on first use. A turn asks its provider through a
few verbs (its guard, its limits, what a model can do, a slot and the server slot it names,
what the server said of a turn) and never the runtime's tables. A reload that changes a
provider's settings retires it whole: the turns in flight finish on it (its client is closed
later, its streams drained), the next turn gets a new one made from the new settings, which
inherits only its :class:`~.health.Health` (the breakers and the background probe: what is
known of the server, as before a reload). Slot files on the server are never deleted.
"""

from contemplation.engine.provider.health import Health
from contemplation.engine.provider.provider import Provider

__all__ = ["Health", "Provider"]
