"""The approvals console for operators (`/ui`): see routes.py."""
