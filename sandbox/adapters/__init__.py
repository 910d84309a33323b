"""Adapters for agent frameworks: one session's policy-filtered tools as the framework's own
tools, results and errors mapped the framework's way (docs/adapters.md). Each module imports its
framework (an extra) only when used: `sandbox.adapters.langchain`, `sandbox.adapters.pydantic_ai`,
`sandbox.adapters.openai_agents`."""
