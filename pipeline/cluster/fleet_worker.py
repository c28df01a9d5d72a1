"""The GPU actor of a live fleet (``GpuWorker``): one GPU's batched multi-source pipeline, cameras
joining and leaving while it runs; the controller (fleet.py) places them and watches its reports."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from .fleetspec import Camera, FleetSpec

log = logging.getLogger(__name__)


class GpuWorker:
    """One GPU's pipeline: cameras join (``add``) and leave (``remove``) while it runs."""

    def __init__(self, index: int, spec: dict[str, Any]) -> None:
        from pipeline.cli.config import load_config
        from pipeline.run.app import assemble
        from pipeline.run.build import build_stages
        from pipeline.sinks.build import build_outputs

        spec_ = FleetSpec.from_dict(spec)
        self.index, self.spec = index, spec_
        overrides = {**spec_.pipeline, "publish_connect": spec_.broker, "progress": False}
        if spec_.curve_dir:
            overrides.update(curve_dir=spec_.curve_dir, curve_client=spec_.curve_client)
        self.cfg = load_config(None, overrides)
        self.stop = threading.Event()
        self.sinks = build_outputs(self.cfg, self.stop, several=True).sinks
        self.stages = build_stages(self.cfg)
        self.runner, _ = assemble(self.cfg, [], self.stages, self.sinks, self.stop,
                                  max_frames_per_step=spec_.capacity)
        self.runner.keep_alive = True
        self.runner.on_result = None  # no terminal display inside an actor
        self._thread = threading.Thread(target=self.runner.run, name=f"fleet-gpu-{index}", daemon=True)
        self._thread.start()
        self.node = node_id()
        log.info("fleet GPU actor %d on node %s (%s): ready", index, self.node, self.stages.device)

    def add(self, camera: dict[str, Any]) -> dict[str, Any]:
        """Open a camera and batch it in; {"ok": False, "error": ...} when it does not open."""
        from pipeline.cli.sourcespecs import SourceSpec
        from pipeline.run.app import open_spec

        from ..sources import SourceError

        cam = Camera(**camera)
        if cam.id in self.runner.sources:
            return {"ok": True, "already": True}
        try:
            source = open_spec(self.cfg, SourceSpec(cam.id, cam.uri, cam.realtime, cam.stall_timeout_s, "fleet"))
        except SourceError as exc:
            return {"ok": False, "error": str(exc).splitlines()[0]}
        try:
            self.runner.add_source(source)
        except (ValueError, RuntimeError, TimeoutError) as exc:
            source.stop()
            return {"ok": False, "error": str(exc)}
        return {"ok": True}

    def remove(self, camera_id: str) -> bool:
        try:
            self.runner.remove_source(camera_id)
        except KeyError:
            return False
        return True

    def report(self) -> dict[str, Any]:
        """The cameras running here with their frame counts; raises when the pipeline has died."""
        if not self._thread.is_alive():
            raise RuntimeError(f"the pipeline of GPU actor {self.index} stopped: {self.runner.stats.error}")
        failed = dict(self.runner.stats.failed)
        return {"index": self.index, "node": self.node, "sources": self.runner.describe(), "failed": failed,
                "pid": os.getpid()}

    def shutdown(self) -> None:
        self.stop.set()
        self._thread.join(30)


def node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()
