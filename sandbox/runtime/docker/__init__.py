"""The Docker backend: everything that speaks to a Docker engine (containers, execs, images,
networks, the egress edge and browsers on them, the host firewall and procfs tricks for them)."""
