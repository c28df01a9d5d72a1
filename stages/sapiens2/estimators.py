"""The public Sapiens2 API: one estimator per task, each preprocess -> infer -> postprocess.

Each estimator wraps a loaded :class:`Sapiens2` (or loads one from a source) and offers
``predict(...)`` on host numpy images, plus the device-side steps the pipeline calls directly so
tensors stay on the GPU. Every output is checked for non-finite values before it is returned.

    pose = PoseEstimator("facebook/sapiens2-pose-0.4b")
    kps = pose.predict(image_rgb, boxes_xyxy)        # Keypoints: xy (N, 308, 2), scores (N, 308)
    seg = Segmenter("facebook/sapiens2-seg-0.4b").predict(image_rgb)   # (H, W) uint8 class ids
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import torch
from torch import Tensor

from ..tasks import get_task
from ..types import Keypoints, Matte
from .config import check_image_size
from .fastpath import FastPath, bucket, bucket_sizes
from .forward import FastForward
from .graphs import warming_up
from .model import Sapiens2
from .postprocess import composite, decode_pose, flip_back, matting_maps, normal_maps, pointmaps, seg_classes
from .preprocess import crop_persons, resize_full, resize_pad, to_device_image
from .verify import check_image
from .weights import cache_root, load_model

log = logging.getLogger(__name__)


class NonFiniteOutputError(RuntimeError):
    """A stage produced NaN or Inf (e.g. fp16 overflow); its output is not passed on."""


def check_finite(tensor: Tensor, stage: str) -> None:
    if not bool(torch.isfinite(tensor).all()):
        raise NonFiniteOutputError(
            f"{stage}: the model produced non-finite values (NaN/Inf); try --dtype bfloat16 or float32"
        )


class _Estimator:
    task = ""

    def __init__(self, model: Sapiens2 | str | os.PathLike, input_size: tuple[int, int] | None = None,
                 device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
                 fastpath: FastPath | None = None) -> None:
        self.model = model if isinstance(model, Sapiens2) else load_model(model, device=device, dtype=dtype)
        if self.model.cfg.task != self.task:
            raise ValueError(f"{getattr(self.model, 'source', 'model')} is a {self.model.cfg.task} checkpoint, "
                             f"not {self.task}")
        self.input_size = tuple(input_size or self.model.cfg.image_size)
        check_image_size(self.input_size, self.model.cfg.patch_size)
        self._requested = fastpath or FastPath()
        self._forward: FastForward | None = None
        self._setup_forward()

    def _setup_forward(self) -> None:
        if self._forward is not None:
            self._forward.close()
        fastpath = self._requested.resolve(self.model, self.input_size)
        self.model.set_channels_last(bool(fastpath.channels_last))
        self._forward = FastForward(self.model, fastpath, self.task, cache_root())
        log.info("%s fast path: %s", self.task, fastpath.describe())

    @property
    def fastpath(self) -> FastPath:
        """The fast path in use: resolved for the device, less what failed its check."""
        return self._forward.fastpath

    @property
    def needs_warm_up(self) -> bool:
        """Whether ``warmup`` has a fast path to check, graphs to capture or shapes to compile."""
        return self.fastpath.needs_warm_up or self.model.dtype == torch.float16

    def set_dtype(self, dtype: torch.dtype) -> None:
        """Cast the model to another compute dtype (e.g. float16 -> bfloat16 after an overflow) and
        set its forward up again (attention kernels probed, graphs captured again for the new dtype)."""
        self.model.set_precision(dtype)
        self._setup_forward()

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def random_weights(self) -> bool:
        return bool(getattr(self.model, "random_weights", False))

    def image_tensor(self, image: np.ndarray | Tensor) -> Tensor:
        return to_device_image(image, self.device)

    def forward(self, pixels: Tensor) -> tuple[Tensor, Tensor | None]:
        """The model's raw outputs through the fast path (checked, compiled when ready, CUDA graphs)."""
        return self._forward(pixels)

    def warmup_batches(self, max_batch: int) -> list[int]:
        """Batch sizes this estimator will see: frames per step for the full-frame stages (1 to
        ``max_batch`` sources), person buckets for pose."""
        return list(range(1, max(1, max_batch) + 1))

    def pixels(self, image: Tensor, batch: int) -> Tensor:
        """The model input of ``batch`` copies of one (3, H, W) uint8 frame (pose: its full-frame box)."""
        pixels = self.preprocess(image)
        return pixels.expand(batch, *pixels.shape[1:])

    def _warmup_once(self, image: Tensor, batch: int) -> None:
        self.infer(self.pixels(image, batch))

    @torch.inference_mode()
    def warmup(self, max_batch: int = 8) -> float:
        """Check every fast path against eager, run every input shape (twice under CUDA graphs: once
        as it is, once captured and replayed) on the current stream (call it on the stream that will
        replay the graphs), then start compiling in the background (``compile``).

        Returns the seconds it took. Outputs are discarded.
        """
        start = time.perf_counter()
        with warming_up():  # its compiles start when every warm-up under way has captured its graphs
            check = self.image_tensor(check_image(self.input_size))  # (3, H, W)
            self._forward.check_switches(self.pixels(check, 1))
            h, w = self.input_size
            image = self.image_tensor(np.zeros((h, w, 3), np.uint8))  # (3, H, W), laid out as real frames
            runs = 2 if self.fastpath.graphs else 1
            for batch in self.warmup_batches(max_batch):
                for _ in range(runs):
                    self._warmup_once(image, batch)
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
            seconds = time.perf_counter() - start
            graphs = self._forward.graphs
            captured = f", {len(graphs.captures)} CUDA graphs captured" if graphs is not None else ""
            log.info("%s warm-up (%s) %.1f s%s", self.task, self.fastpath.describe(), seconds, captured)
            self.start_compile()
        return seconds

    def start_compile(self) -> None:
        """With ``compile`` on: compile every input shape run so far in the background (each new one
        as it comes); each is used once compiled and checked against eager. ``warmup`` calls it."""
        device = self.device
        self._forward.start_compile(lambda shape, dtype: torch.zeros(shape, dtype=dtype, device=device))

    @property
    def switched_off(self) -> dict[str, str]:
        """The fast paths turned off for this run, each with why (the warning it logged)."""
        return dict(self._forward.off)

    def compile_seconds(self, pixels_shape: tuple[int, ...]) -> float:
        """How long the background compile of an input shape took (0: not compiled)."""
        compiler = self._forward.compiler
        return 0.0 if compiler is None else compiler.seconds(tuple(pixels_shape))

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Until every input shape seen is compiled (``compile`` on): True when all are ready."""
        return self._forward.wait_compiled(timeout)

    def close(self) -> None:
        """Stop compiling in the background (the forward keeps working)."""
        self._forward.close()


class PoseEstimator(_Estimator):
    """308 whole-body keypoints for every person box, in one batched forward (padded to a bucket)."""

    task = "pose"

    def __init__(self, model: Sapiens2 | str | os.PathLike, input_size: tuple[int, int] | None = None,
                 flip_test: bool = False, flip_pairs: np.ndarray | None = None, blur_kernel: int = 11,
                 padding: float = 1.25, max_refine_offset: float | None = 1.0, buckets: bool = True,
                 crop_sampling: str = "auto", **kwargs) -> None:
        super().__init__(model, input_size, **kwargs)
        self.crop_sampling = crop_sampling  # see preprocess.crop_persons
        self.flip_test, self.blur_kernel, self.padding = flip_test, blur_kernel, padding
        # Pad the person batch to a bucket (1/2/4/8/16): few shapes for cuDNN autotuning, compiled
        # graphs and CUDA graphs, at the cost of the padding rows. Off: the batch is the person count.
        self.buckets = buckets
        self.max_refine_offset = max_refine_offset  # None: keep every DARK step, as the reference
        if flip_pairs is None:
            from ..metadata import load_metadata

            flip_pairs = load_metadata().flip_pairs
        self.flip_pairs = torch.tensor(np.asarray(flip_pairs), dtype=torch.long, device=self.device)

    def preprocess(self, image: Tensor, boxes: Tensor) -> Tensor:
        """(3, H, W) uint8 + (N, 4) xyxy -> (bucket(N), 3, h, w) crops; padding rows are zeros."""
        crops = crop_persons(image, boxes, self.input_size, self.padding, self.crop_sampling)
        n = crops.shape[0]
        pad = bucket(n) - n if n and self.buckets else 0
        if pad:
            crops = torch.cat((crops, crops.new_zeros(pad, *crops.shape[1:])))
        return crops

    @torch.inference_mode()
    def infer(self, crops: Tensor, n: int) -> Tensor:
        """Crops -> heatmaps (n, K, h/4, w/4); with flip test, mirrored crops run in the same batch."""
        if n == 0:
            return crops.new_zeros(0, self.model.cfg.num_labels, self.input_size[0] // 4, self.input_size[1] // 4)
        batch = torch.cat((crops, crops.flip(-1))) if self.flip_test else crops
        heatmaps, _ = self.forward(batch)
        if self.flip_test:
            b = crops.shape[0]
            heatmaps = (heatmaps[:b] + flip_back(heatmaps[b:], self.flip_pairs)) / 2
        return heatmaps[:n]

    def warmup_batches(self, max_batch: int) -> list[int]:
        """Every bucket up to max_batch persons (every person count when buckets are off)."""
        return bucket_sizes(max_batch) if self.buckets else list(range(1, max(1, max_batch) + 1))

    def pixels(self, image: Tensor, batch: int) -> Tensor:
        h, w = image.shape[1:]
        boxes = torch.tensor([[0.0, 0.0, w - 1.0, h - 1.0]], device=self.device).expand(batch, 4)
        return self.preprocess(image, boxes)

    def _warmup_once(self, image: Tensor, batch: int) -> None:
        self.infer(self.pixels(image, batch), batch)

    def postprocess(self, heatmaps: Tensor, boxes: Tensor) -> tuple[Tensor, Tensor]:
        return decode_pose(heatmaps, boxes, self.input_size, self.blur_kernel, self.padding, self.max_refine_offset)

    @torch.inference_mode()
    def run_batch(self, images: list[Tensor], boxes: list[Tensor]) -> tuple[Tensor, Tensor, list[Tensor]]:
        """Persons of several frames in one forward: images (3, H, W) uint8 and their boxes (n_i, 4)
        -> keypoints (sum n_i, K, 2) image pixels, scores (sum n_i, K), frames in order, and every
        tensor to check for non-finite values: the raw heatmaps' too (decoding hides a -Inf, which
        the blur-and-log refinement clamps, and a caller's clamp to the image hides an Inf)."""
        crops = torch.cat([crop_persons(image, b, self.input_size, self.padding, self.crop_sampling)
                           for image, b in zip(images, boxes)])
        n = crops.shape[0]
        pad = bucket(n) - n if n and self.buckets else 0
        if pad:
            crops = torch.cat((crops, crops.new_zeros(pad, *crops.shape[1:])))
        heatmaps = self.infer(crops, n)  # (n, K, h/4, w/4): the persons' rows, flip test averaged in
        xy, scores = self.postprocess(heatmaps, torch.cat(boxes))
        # The scores are the maps' maxima (a NaN or +Inf shows there) and the minima show a -Inf: these
        # two check every raw value, and the caller checks (n, K) values instead of the whole maps.
        lowest = heatmaps.amin(dim=(2, 3))  # (n, K)
        return xy, scores, [lowest, xy, scores]

    @torch.inference_mode()
    def predict(self, image: np.ndarray, boxes: np.ndarray) -> Keypoints:
        """image (H, W, 3) uint8 RGB, boxes (N, 4) xyxy pixels -> Keypoints in image pixels."""
        boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
        image_t = self.image_tensor(image)
        boxes_t = torch.as_tensor(boxes, device=self.device)
        heatmaps = self.infer(self.preprocess(image_t, boxes_t), len(boxes))
        xy, scores = self.postprocess(heatmaps, boxes_t)
        for tensor in (heatmaps, xy, scores):
            check_finite(tensor, "pose")
        return Keypoints(xy.cpu().numpy(), scores.cpu().numpy())


class _FrameEstimator(_Estimator):
    """Stages that see the whole frame (seg, matting, normals, pointmap).

    ``postprocess`` returns named device tensors at frame size; the pipeline downloads them as they
    are, ``predict`` returns them on the host.
    """

    check_outputs = True  # the post-processed maps are checked for non-finite values too, not only the model's

    @torch.inference_mode()
    def infer(self, pixels: Tensor) -> tuple[Tensor, Tensor | None]:
        return self.forward(pixels)

    def postprocess(self, raw: tuple[Tensor, Tensor | None], frame_hw: tuple[int, int]) -> dict[str, Tensor]:
        raise NotImplementedError

    @torch.inference_mode()
    def run_batch(self, images: list[Tensor]) -> tuple[list[dict[str, Tensor]], list[Tensor]]:
        """(3, H, W) uint8 frames on the device (sizes may differ) -> one forward over all of them ->
        (each frame's outputs at its size, every tensor to check for non-finite values)."""
        maps, scale = self.infer(torch.cat([self.preprocess(image) for image in images]))
        outputs = []
        for i, image in enumerate(images):
            raw = (maps[i:i + 1], None if scale is None else scale[i:i + 1])
            outputs.append(self.postprocess(raw, (image.shape[1], image.shape[2])))
        checked = [maps] if scale is None else [maps, scale]
        if not self.check_outputs:
            return outputs, checked
        return outputs, checked + [t for out in outputs for t in out.values() if t.is_floating_point()]

    def run(self, image: Tensor) -> tuple[dict[str, Tensor], list[Tensor]]:
        """One (3, H, W) uint8 frame -> (its outputs at frame size, the tensors to check for non-finite values)."""
        outputs, checked = self.run_batch([image])
        return outputs[0], checked

    def predict_host(self, image: np.ndarray) -> dict[str, np.ndarray]:
        """image (H, W, 3) uint8 RGB -> this stage's named outputs as numpy arrays (checked finite)."""
        outputs, checked = self.run(self.image_tensor(image))
        for tensor in checked:
            check_finite(tensor, self.task)
        return {name: t.cpu().numpy() for name, t in outputs.items()}

    def result(self, outputs: dict[str, np.ndarray]) -> object:
        """What this task gives a FrameResult, from its named host outputs (default: the map of its name)."""
        return outputs[self.task]


class _FullFrameEstimator(_FrameEstimator):
    """Segmentation and matting: the whole frame resized to the input (aspect not kept)."""

    def preprocess(self, image: Tensor) -> Tensor:
        return resize_full(image, self.input_size)


class Segmenter(_FullFrameEstimator):
    """Body-part segmentation (29 classes) of the full frame."""

    task = "seg"

    def postprocess(self, raw: tuple[Tensor, Tensor | None], frame_hw: tuple[int, int]) -> dict[str, Tensor]:
        return {"seg": seg_classes(raw[0], frame_hw)[0].to(torch.uint8)}  # (H, W) class ids

    def predict(self, image: np.ndarray) -> np.ndarray:
        """image (H, W, 3) uint8 RGB -> (H, W) uint8 class ids."""
        return self.predict_host(image)["seg"]


class MattingEstimator(_FullFrameEstimator):
    """Human matting: alpha and premultiplied foreground of the full frame."""

    task = "matting"

    def postprocess(self, raw: tuple[Tensor, Tensor | None], frame_hw: tuple[int, int]) -> dict[str, Tensor]:
        alpha, fg = matting_maps(raw[0], frame_hw)
        return {"matting": alpha[0], "matting.fg": fg[0].permute(1, 2, 0).contiguous()}  # (H, W), (H, W, 3)

    def result(self, outputs: dict[str, np.ndarray]) -> Matte:
        return Matte(outputs["matting"], outputs["matting.fg"])

    def predict(self, image: np.ndarray) -> Matte:
        """image (H, W, 3) uint8 RGB -> Matte(alpha (H, W) in [0, 1], foreground (H, W, 3))."""
        return self.result(self.predict_host(image))

    @staticmethod
    def composite(matte: Matte, background: np.ndarray) -> np.ndarray:
        """Foreground over a background (H, W, 3) uint8 of the same size -> (H, W, 3) uint8."""
        fg = torch.from_numpy(matte.foreground).permute(2, 0, 1)[None]
        alpha = torch.from_numpy(matte.alpha)[None]
        bg = torch.from_numpy(np.ascontiguousarray(background)).permute(2, 0, 1)[None].float() / 255.0
        return composite(fg, alpha, bg)[0].permute(1, 2, 0).numpy()


class _DenseEstimator(_FrameEstimator):
    """Normals and pointmaps: aspect kept, padded input, maps cropped back and resized."""

    def preprocess(self, image: Tensor) -> Tensor:
        return resize_pad(image, self.input_size)

    def predict(self, image: np.ndarray) -> np.ndarray:
        """image (H, W, 3) uint8 RGB -> (H, W, 3) float32 (unit normals, or XYZ per pixel)."""
        return self.predict_host(image)[self.task]


class NormalEstimator(_DenseEstimator):
    task = "normal"

    def postprocess(self, raw: tuple[Tensor, Tensor | None], frame_hw: tuple[int, int]) -> dict[str, Tensor]:
        return {"normal": normal_maps(raw[0], frame_hw, self.input_size)[0].permute(1, 2, 0).contiguous()}


class PointmapEstimator(_DenseEstimator):
    task = "pointmap"
    # The model's own outputs are checked; the map divided by a scale of 0 on one frame is not finite there,
    # which is that frame's degenerate prediction, not a broken model: its 3D points are invalid (lift).
    check_outputs = False

    def __init__(self, model: Sapiens2 | str | os.PathLike, input_size: tuple[int, int] | None = None,
                 **kwargs) -> None:
        super().__init__(model, input_size, **kwargs)
        if self.model.cfg.head.has_scale and self.input_size != tuple(self.model.cfg.image_size):
            raise ValueError(f"this pointmap model's scale branch needs input size {self.model.cfg.image_size}")

    def postprocess(self, raw: tuple[Tensor, Tensor | None], frame_hw: tuple[int, int]) -> dict[str, Tensor]:
        maps, scale = raw  # XYZ divided by the predicted focal-length scale when the head has one
        return {"pointmap": pointmaps(maps, scale, frame_hw, self.input_size)[0].permute(1, 2, 0).contiguous()}


def estimator_for(task: str) -> type[_Estimator]:
    """The estimator class of a task (``stages.tasks``)."""
    return get_task(task).estimator_class()
