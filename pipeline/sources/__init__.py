"""Where frames come from: readers (PyAV, images, demo), flow control, and the watched Source."""

from .readers import SourceEnded, SourceError
from .source import Source, open_source

__all__ = ["Source", "SourceEnded", "SourceError", "open_source"]
