"""Model clients behind one interface (``ModelClient``)."""
