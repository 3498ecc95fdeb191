"""The chat API (FastAPI): ``offpath.api.app:app``."""
