"""Sapiens2 inference core: model, loading, pre/post-processing and task estimators."""

from .config import TASKS, ConfigError, HeadConfig, Sapiens2Config, variant
from .model import Sapiens2
from .weights import CheckpointError, load_model

__all__ = ["TASKS", "CheckpointError", "ConfigError", "HeadConfig", "Sapiens2", "Sapiens2Config", "load_model",
           "variant"]
