"""diffattn: differential attention for language models (placeholder, filled below)."""
__version__ = "0.1.0"
