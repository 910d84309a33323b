"""Sub-agent sessions: lineage, inboxes, visibility and the cascade (see service.py)."""
