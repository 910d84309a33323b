"""The SQLite state store (the default: `state.url` absent or `sqlite:`): a file in state_dir."""
