"""The offpath command line (typer): ``offpath.cli.main:app``, one module per command group.

The top layer: may import every other one (``tests/test_layout.py``)."""
