"""The offpath command line (typer)."""
