"""Error types shared by stages and the pipeline."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value that cannot be used (a run config key, a flag, a checkpoint's config.json);
    the message names the key and where it came from."""
