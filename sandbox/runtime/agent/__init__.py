"""The resident-agent client: the frame codec, the link to one agent, and a backend's agents.

The link speaks over any byte stream (transport.py): Docker's attached exec socket is one
(runtime/docker/agent_stream.py), a local subprocess's pipes another (pipe.py, for tests).
Nothing here imports docker or a backend folder (the `agent-over-any-stream` contract).
"""
