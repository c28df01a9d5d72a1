"""``--metrics``: the sink that keeps the Prometheus metrics of ``pipeline.metrics`` current."""

from __future__ import annotations

from typing import Any

from pipeline.metrics import PipelineMetrics
from stages.types import FrameResult, StreamInfo


class MetricsSink:
    """The sink that keeps the metrics current: every frame, every health change of a source."""

    def __init__(self, metrics: PipelineMetrics) -> None:
        self.metrics = metrics
        self._failed: set[str] = set()

    def open(self, info: StreamInfo) -> None:
        self.metrics.add_source(info.source_id)
        self.metrics.beat()

    def write(self, result: FrameResult) -> None:
        self.metrics.observe(result)

    def event(self, record: dict[str, Any]) -> None:
        source = str(record.get("source_id"))
        self.metrics.source_up.labels(source).set(1 if record.get("event") == "resumed" else 0)
        if record.get("event") == "failed":
            self._failed.add(source)

    def close_source(self, source_id: str) -> None:
        if source_id not in self._failed:  # a failed source stays at 0, as one that could not open
            self.metrics.source_up.remove(source_id)

    def close(self) -> None:
        pass
