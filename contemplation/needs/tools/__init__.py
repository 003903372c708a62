"""Tool families that answer NEEDs: one module each, behind :class:`tools.base.Tool`."""
