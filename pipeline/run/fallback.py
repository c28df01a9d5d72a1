"""The engine's answer to non-finite outputs: a float16 stage falls back to bfloat16 and its step is
computed again; in other dtypes, or when bfloat16 does not help, NonFiniteOutputError stops the run.

A mixin of FrameEngine (pipeline.run.engine), which provides the stages, lanes, the person task and the
``_persons``, ``_dense`` and ``_lift`` steps it calls again.
"""

from __future__ import annotations

import logging

import torch

from pipeline.run.step import Clock, Pending
from stages.sapiens2.estimators import NonFiniteOutputError
from stages.tasks import TASKS

log = logging.getLogger("pipeline.run.engine")  # the engine's own messages, whichever module says them


class PrecisionFallback:
    """``_ensure_finite`` and ``_switch_to_bfloat16`` of FrameEngine."""

    def _ensure_finite(self, pending: Pending) -> None:
        """Every stage's flag; in float16 a failing stage falls back to bfloat16 and runs again."""
        for name in [k for k in pending.outputs if k.endswith(".finite")]:
            if bool(pending.outputs[name]):
                continue
            task = name.split(".")[0]
            est = self.stages.estimators[task]
            ran = pending.dtypes.get(task, est.model.dtype)  # a pipelined step may have run before a switch
            if ran != torch.float16:
                advice = ("check the checkpoint: its weights hold NaN/Inf, or it is not a Sapiens2 checkpoint of "
                          "this task" if ran == torch.float32 else "check the checkpoint, or try --dtype float32")
                raise NonFiniteOutputError(f"{task}: the model produced non-finite values (NaN/Inf) in "
                                           f"{str(ran)[6:]}; {advice}")
            if est.model.dtype == torch.float16:
                log.warning("%s: float16 overflowed (non-finite output); this stage runs in bfloat16 from now on", task)
                self._switch_to_bfloat16(task)
            redo = Pending(pending.frames, Clock(self.device))
            with torch.inference_mode():
                if TASKS[task].per_person:
                    self._persons(redo, None, redo=True)
                else:
                    self._dense(redo, task, TASKS[task].stream, None, redo=True)
                    key = f"{self.person}."
                    if self.keypoints3d is not None and TASKS[task].lift is not None and key + "xy" in pending.outputs:
                        redo.wait()  # the 3D step again, on the new maps and this step's keypoints
                        with_persons = [w for w in pending.frames if len(w.detections)]
                        with self.streams.use(TASKS[self.person].stream):  # allocated on the stream that uses them
                            xy, scores = (pending.outputs[key + k].to(self.device) for k in ("xy", "scores"))
                            self._lift(redo, with_persons, xy, scores)
            redo.wait()
            if not bool(redo.outputs[name]):
                raise NonFiniteOutputError(f"{task}: non-finite output in float16 and in bfloat16; "
                                           "check the checkpoint, or try --dtype float32")
            pending.outputs.update(redo.outputs)
            for work, again in zip(pending.frames, redo.frames):
                work.outputs.update(again.outputs)

    def _switch_to_bfloat16(self, task: str) -> None:
        """The weights change dtype only when no stream reads them: a step already queued in float16 still
        runs on them, and the memory the old weights free must not be handed to the new ones meanwhile.
        A warmed-up engine warms the stage up again (compiled graphs and CUDA graphs of the new dtype are
        made now, once, not frame by frame as each shape first comes)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.stages.estimators[task].set_dtype(torch.bfloat16)
        if self._warmed is not None:
            self._warm(task)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        if self.on_precision_change is not None:
            self.on_precision_change()
