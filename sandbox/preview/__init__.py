"""Preview URLs: a web server in a sandbox, shown through the service (docs/preview.md)."""
