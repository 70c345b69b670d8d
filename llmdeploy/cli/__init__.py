"""Command-line interface: one module per verb group, registered in `main`."""
