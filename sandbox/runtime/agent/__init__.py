"""The resident-agent client: the frame codec, the link to one agent, and a backend's agents.

Today the link speaks over Docker's attached exec socket (link.py imports the Docker exec module);
the contracts in pyproject.toml list that crossing until the link works over any byte stream.
"""
