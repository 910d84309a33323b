"""The host backend (`runtime.backend: host`, and mode `off`'s shell) and what assumes a local host:
workspace folders made on this machine's disk, and kills through its /proc."""
