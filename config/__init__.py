"""A run's configuration: :class:`RunConfig` (a field per flag and study-file key), the logging
profiles, the study file (``--config``), the run manifest built from a config, and the run plan
(``config/plan.py``): the config resolved once into what the rest of the run reads."""

from hallulog.config.plan import RunPlan, TaskPlan, plan_run, plan_task
from hallulog.config.run_config import PROFILES, ConfigError, LoggingProfile, RunConfig

__all__ = [
    "RunConfig",
    "ConfigError",
    "LoggingProfile",
    "PROFILES",
    "RunPlan",
    "TaskPlan",
    "plan_run",
    "plan_task",
]
