"""A run's configuration: :class:`RunConfig` (a field per flag and study-file key), the logging
profiles, the study file (``--config``) and the run manifest built from a config."""

from hallulog.config.run_config import PROFILES, ConfigError, LoggingProfile, RunConfig

__all__ = ["RunConfig", "ConfigError", "LoggingProfile", "PROFILES"]
