"""Generation engines behind one interface (``base.Engine``), chosen by name (``registry``)."""
