"""The state store's schema history: ordered SQL files, one folder per dialect (see migrate.py)."""
