"""The PostgreSQL state store (`state.url: postgresql://...`): psycopg 3, async, with a pool.

Only this folder imports psycopg (an import-linter contract keeps it so); it is the `postgres`
extra, and a missing extra is a clear error naming it.
"""
