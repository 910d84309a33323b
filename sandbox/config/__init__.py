"""Configuration: models, loading with located errors, and the merged per-agent view."""

from sandbox.config.loader import load_config, load_config_text
from sandbox.config.merge import EffectiveAgent, agent_ids, default_agent_id, effective_agent
from sandbox.config.models import Config

__all__ = [
    "Config",
    "EffectiveAgent",
    "agent_ids",
    "default_agent_id",
    "effective_agent",
    "load_config",
    "load_config_text",
]
