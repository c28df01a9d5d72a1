"""Device benchmark phases of what a user runs: the real command, ``python -m pipeline.cli.main``, on the
embedded demo clip with the real-size checkpoints of the checkpoints phase, its keypoint messages read
by a ZeroMQ subscriber in this process (``e2e``: the rows that answer the issue's targets; ``e2e_more``:
the others), and the first and second start of a compiled run (``starts``).

Rows: pose, seg, pose + seg; full-frame and the YOLO detector (random weights: its cost is real, its
boxes are not); 1 and 4 sources; a live-paced row (``--realtime``) for the latency a camera sees; a
``--compile default`` row on the demo clip looped (``loop:``, an H.264 file of its first 3 s), stopped
once every stage switched to its compiled forward: when each did, and the FPS before and after.
Per row: frames per second (keypoint messages received, first 10% dropped), capture -> receive
latency p50/p95 (a file source's frames wait in its 8-frame queue: the paced row is the camera's
figure), the warm-up seconds the run logged, the fast paths it switched off, its exit status. Each
row is written to the report as it ends, so a phase its watchdog ends keeps the rows before; each
command runs under a guard that ends it when the benchmark's worker dies (no 0.4B run outlives its
phase on the GPU).
"""

from __future__ import annotations

import functools
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.devicekit import REPO, Ctx
from bench.harness import percentile


@dataclass(frozen=True)
class Row:
    """One run of the command. ``estimate_s``: its wall time on an H200, from the 2026-12-04 runs of the same
    command there (eager: pose 15 s, seg 13 s, pose + seg 20 s, with YOLO 25 s, 4 sources 37 s; start-up,
    load and warm-up 5-9 s of each), plus the capture of its CUDA graphs at warm-up."""

    label: str
    tasks: str
    flags: tuple[str, ...]
    sources: int
    estimate_s: float
    answers: str = ""  # the target it answers
    until_compiled: bool = False  # the demo clip looped, the run stopped once every stage runs compiled


YOLO, FULL = ("--detector-model", "yolo11n.yaml"), ("--detector", "full-frame")
TARGET_ROWS = (  # phase e2e: the rows that answer a target, those of the default command first
    Row("pose + seg, YOLO11n", "pose,seg", YOLO, 1, 28, "one person: >= 60 FPS (p95 <= 50 ms: the paced row)"),
    Row("pose, YOLO11n, 4 sources", "pose", YOLO, 4, 35, "4 sources: >= 30 FPS each"),
    Row("pose + seg, full frame, paced live (--realtime)", "pose,seg", (*FULL, "--realtime"), 1, 20,
        "one person: p95 <= 50 ms, as a camera sees it"),
)
MORE_ROWS = (  # phase e2e_more
    # One person (full frame), so --max-persons 1: the compile queue holds the shapes the run uses (pose x1, seg
    # x1), not the pose buckets 2/4/8 that a full frame never reaches. Compiled in 10-15 s a shape from the run's
    # Inductor cache, which the graphs phase filled with the same shapes; 35-40 s a shape without (the row then
    # ends at its limit if it must: the switches seen so far are its figures).
    Row("pose + seg, full frame, --compile default", "pose,seg", (*FULL, "--compile", "default", "--max-persons", "1"),
        1, 45, "compile a user can afford: when each shape switched, FPS before and after", until_compiled=True),
    Row("pose + seg, full frame", "pose,seg", FULL, 1, 22),
    Row("pose + seg, full frame, 4 sources", "pose,seg", FULL, 4, 40),
    Row("pose, full frame", "pose", FULL, 1, 17),
    Row("seg", "seg", FULL, 1, 15),
)
# The smoke run: one row per phase, a few frames (the code path of every row: the others are the same
# command with other flags); the rest are listed as not run.
SMOKE_ROWS = ("pose, YOLO11n, 4 sources", "pose, full frame")
ROW_LIMIT = 2.5  # a row is stopped after this many times its estimate (or at the phase's end)
# A --compile row goes on this long, and for this many keypoint messages, after its last stage switched.
AFTER_SWITCH_S, AFTER_SWITCH_MESSAGES = 5.0, 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Receiver(threading.Thread):
    """Keypoint messages of a run: (receive ns, capture ns, source) per message."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(name="e2e-subscriber", daemon=True)
        self.endpoint, self.stop = endpoint, threading.Event()
        self.got: list[tuple[int, int, str]] = []

    def run(self) -> None:
        from sapiens2_client.subscriber import ReceiveTimeout, Subscriber

        with Subscriber(self.endpoint, ["keypoints"]) as sub:
            while not self.stop.is_set():
                try:
                    msg = sub.recv(timeout_s=0.2)
                except ReceiveTimeout:
                    continue
                self.got.append((time.time_ns(), msg.meta.capture_ns, msg.meta.source_id))


# Run in the child before the command: the kernel sends it SIGTERM when the worker that started it dies (the
# watchdog ends a worker with os._exit, which would leave a 0.4B run holding the GPU for the next phase); the
# command (SIGTERM: it finishes and closes its outputs) then replaces this process.
_GUARD = """import ctypes, os, signal, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (Linux; elsewhere nothing)
except (AttributeError, OSError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit("the benchmark worker that started this command is gone")
os.execv(sys.argv[2], sys.argv[2:])
"""


def guarded(argv: list[str]) -> list[str]:
    """argv (an absolute executable first) run so that it ends when this process dies."""
    return [sys.executable, "-c", _GUARD, str(os.getpid()), *argv]


def _command(ctx: Ctx, row: Row, endpoint: str, clip: Path | None = None) -> list[str]:
    argv = [sys.executable, "-m", "pipeline.cli.main", "--device", str(ctx.device), "--no-progress", "--tasks",
            row.tasks, "--publish", endpoint, *row.flags]
    for task in row.tasks.split(","):
        argv += ["--checkpoint", f"{task}={ctx.ckpt(task)}"]
    source = "demo" if clip is None else f"loop:{clip}"
    argv += ["--source", source] if row.sources == 1 else \
        [a for i in range(row.sources) for a in ("--source", f"c{i}={source}")]
    if ctx.smoke:
        argv += ["--max-frames", "6", "--dtype", "float32"]
    return argv


_DONE = re.compile(r"done: (\d+) frames(?: from \d+ sources in \d+ batched steps \([\d.]+ frames per step\))?, "
                   r"([\d.]+) fps")
_WARM = re.compile(r"warm-up ([\d.]+) s \(([^)]*)\)")
_OFF = re.compile(r"(\w+): fast path (.+?) switched off for this run")


def parse_log(lines: list[str]) -> dict[str, Any]:
    """What a run's log says: its warm-up (seconds, per stage), the CLI's own fps (all sources), the fast
    paths switched off (``task: name``) and its error line."""
    text = "\n".join(lines)
    warm, done = _WARM.search(text), _DONE.search(text)
    return dict(warm_s=float(warm.group(1)) if warm else None, warm_detail=warm.group(2) if warm else None,
                cli_fps=float(done.group(2)) if done else None,
                switched_off=[f"{task}: {name}" for task, name in _OFF.findall(text)],
                error=next((line for line in lines if line.startswith("error:")), None))


def rate(stamps_ns: list[int], sources: int = 1) -> float | None:
    """Messages per second per source over receive times (ns, in order), or None with fewer than two."""
    if len(stamps_ns) < 2 or stamps_ns[-1] <= stamps_ns[0]:
        return None
    return (len(stamps_ns) - 1) / ((stamps_ns[-1] - stamps_ns[0]) / 1e9) / sources


def write_demo_clip(path: Path, frames: int = 90) -> Path:
    """The demo clip's first ``frames`` frames (1280x720, 30 fps: both of its photos at 90) as an H.264 file,
    for a ``loop:`` source: a run as long as the benchmark wants."""
    import av

    from pipeline.sources.demo import DemoReader

    reader = DemoReader(seconds=frames / 30.0)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=30, options={"preset": "veryfast", "crf": "23"})
        stream.width, stream.height, stream.pix_fmt = reader.width, reader.height, "yuv420p"
        while (raw := reader.read()) is not None:
            picture = av.VideoFrame.from_ndarray(raw.image, format="rgb24")
            picture.pts = raw.pts
            for packet in stream.encode(picture):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


_IN_USE = re.compile(r"(\w+): compiled forward in use for input ([\dx]+) \(compiled in ([\d.]+) s, ([\d.]+) s after "
                     r"start-up")
_COMPILED = re.compile(r"(\w+): input ([\dx]+) compiled in ([\d.]+) s(, from the kept cache)?")


def compile_events(lines: list[tuple[int, str]], started_ns: int) -> dict[str, Any]:
    """What a --compile run's log says of its compiles: each shape compiled (seconds, from the kept cache?),
    each switch to a compiled forward (``at_s``: seconds since the command started, ``stamp_ns``: when the
    line came), and each stage whose compile was switched off (its log line)."""
    compiled, switches, off = [], [], {}
    for stamp, line in lines:
        if (m := _IN_USE.search(line)) is not None:
            switches.append(dict(task=m[1], shape=m[2], compile_s=float(m[3]), after_compile_start_s=float(m[4]),
                                 at_s=round((stamp - started_ns) / 1e9, 1), stamp_ns=stamp))
        elif (m := _COMPILED.search(line)) is not None:
            compiled.append(dict(task=m[1], shape=m[2], seconds=float(m[3]), from_cache=m[4] is not None,
                                 at_s=round((stamp - started_ns) / 1e9, 1)))
        elif (m := _OFF.search(line)) is not None and m[2] == "compile":
            off[m[1]] = (stamp, line)
    return dict(compiled=compiled, switches=switches, off=off)


def switched_all(tasks: list[str], lines: list[tuple[int, str]], received: list[tuple[int, int, str]],
                 now_ns: int) -> bool:
    """Whether a --compile run has what it is run for: every stage switched to its compiled forward (or had
    compile switched off), then AFTER_SWITCH_S seconds and AFTER_SWITCH_MESSAGES keypoint messages."""
    events = compile_events(lines, 0)
    settled = {s["task"]: s["stamp_ns"] for s in events["switches"]} | {t: v[0] for t, v in events["off"].items()}
    if not set(tasks) <= set(settled):
        return False
    last = max(settled[t] for t in tasks)
    after = sum(1 for r, _, _ in received if r > last)
    return now_ns - last >= AFTER_SWITCH_S * 1e9 and after >= AFTER_SWITCH_MESSAGES


def _switched_all_now(tasks: list[str], lines: list[tuple[int, str]], received: list[tuple[int, int, str]]) -> bool:
    return switched_all(tasks, lines, received, time.time_ns())


def compile_figures(run: dict[str, Any], received: list[tuple[int, int, str]], tasks: list[str],
                    sources: int = 1) -> dict[str, Any]:
    """A --compile row's own figures: its compiles and switches, the stages that had not switched when it
    ended, and the FPS (per source) before its first switch (eager + CUDA graphs; the first 10% dropped) and
    after its last (compiled + CUDA graphs)."""
    events = compile_events(run["lines"], run["started_ns"])
    stamps = [r for r, _, _ in received]
    switches = events["switches"]
    first = min((s["stamp_ns"] for s in switches), default=None)
    last = max((s["stamp_ns"] for s in switches), default=None)
    before = [t for t in stamps if first is None or t < first]
    after = [t for t in stamps if last is not None and t > last]
    for s in switches:
        s.pop("stamp_ns")
    settled = {s["task"] for s in switches} | set(events["off"])
    return dict(compiled=events["compiled"], switches=switches,
                compile_off={task: line for task, (_, line) in events["off"].items()},
                not_switched=[t for t in tasks if t not in settled],
                fps_before=rate(before[len(before) // 10:], sources), fps_after=rate(after, sources))


def compile_note(result: dict[str, Any]) -> str:
    """One cell: when each shape switched, how long it compiled (and whether from the kept cache), FPS
    before and after."""
    cached = {(c["task"], c["shape"]): c["from_cache"] for c in result["compiled"]}
    said = [f"{s['task']} {s['shape']} compiled in use at {s['at_s']:.0f} s (compiled in {s['compile_s']:.0f} s"
            + (", kept cache" if cached.get((s["task"], s["shape"])) else "") + ")" for s in result["switches"]]
    said += [f"{task}: compile switched off" for task in result["compile_off"]]
    said += [f"{task}: not switched when the row ended" for task in result["not_switched"]]
    fps = [f"{v:.1f}" if v is not None else "-" for v in (result["fps_before"], result["fps_after"])]
    return "; ".join(said) + f"; FPS {fps[0]} before the first switch, {fps[1]} after the last"


def _read_lines(stream, lines: list[tuple[int, str]]) -> None:
    for line in stream:
        lines.append((time.time_ns(), line.rstrip("\n")))


def run_command(argv: list[str], env: dict[str, str], limit_s: float,
                stop_when: Callable[[list[tuple[int, str]]], bool] | None = None,
                limit_fails: bool = True) -> dict[str, Any]:
    """Run argv (guarded), its output read line by line as it comes: ((stamp ns, line), ...). Stopped with
    SIGINT (the command then finishes and says ``done:``) once ``stop_when(lines)`` is true or at
    ``limit_s`` (its exit status is then "timeout", unless not ``limit_fails``); killed when it does not
    end 20 s after that."""
    lines: list[tuple[int, str]] = []
    started_ns, t0 = time.time_ns(), time.monotonic()
    proc = subprocess.Popen(guarded(argv), env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace")
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), name="e2e-log", daemon=True)
    reader.start()
    stopped_by = None
    while proc.poll() is None:
        if time.monotonic() - t0 > limit_s:
            stopped_by = f"the row's limit ({limit_s:.0f} s)"
        elif stop_when is not None and stop_when(lines):
            stopped_by = "the benchmark (what it measures was done)"
        if stopped_by is not None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            break
        time.sleep(0.1)
    reader.join(5)
    rc: Any = proc.returncode
    if limit_fails and stopped_by is not None and stopped_by.startswith("the row's limit"):
        rc = "timeout"
    return dict(rc=rc, wall_s=round(time.monotonic() - t0, 1), started_ns=started_ns, lines=lines,
                stopped_by=stopped_by)


def run_row(row: Row, argv: list[str], endpoint: str, env: dict[str, str], limit_s: float,
            stop_when: Callable[[list, list], bool] | None = None,
            more: Callable[[dict, list], dict] | None = None) -> dict[str, Any]:
    """One row: the command run (``run_command``) while its keypoint messages are received; its figures.
    ``stop_when(lines, received)`` ends it early; ``more(run, received)`` adds figures of its own."""
    receiver = _Receiver(endpoint)
    receiver.start()
    ran = run_command(argv, env, limit_s, None if stop_when is None else lambda lines: stop_when(lines, receiver.got),
                      limit_fails=stop_when is None)  # a row stopped when it has its figures may end at its limit
    time.sleep(0.3)  # the last messages in flight
    receiver.stop.set()
    receiver.join(5.0)
    got = receiver.got[len(receiver.got) // 10:]  # the first 10%: the pipeline's first steps
    latency = [(r - c) / 1e6 for r, c, _ in got]
    lines = [line for _, line in ran["lines"]]
    result = dict(label=row.label, rc=ran["rc"], wall_s=ran["wall_s"], messages=len(receiver.got),
                  fps_per_source=rate([r for r, _, _ in got], row.sources),
                  p50_ms=percentile(latency, 50) if latency else None,
                  p95_ms=percentile(latency, 95) if latency else None,
                  **parse_log(lines), stopped_by=ran["stopped_by"], estimate_s=row.estimate_s, answers=row.answers,
                  argv=argv[1:])
    if more is not None:
        result.update(more(ran, receiver.got))
    if result["rc"] != 0:
        result["log_tail"] = lines[-15:]
    return result


def compile_start(checkpoint: str, device: str) -> dict[str, Any]:
    """In a process of its own (``python -m bench.device_cli --compile-start CKPT DEVICE``): pose x1 as
    ``--compile default`` starts it, timed: warm-up, then the shape compiled in the background."""
    from stages.sapiens2.estimators import PoseEstimator
    from stages.sapiens2.fastpath import FastPath

    t0 = time.perf_counter()
    pose = PoseEstimator(checkpoint, device=device, fastpath=FastPath(compile="default"))
    loaded = time.perf_counter() - t0
    warm = pose.warmup(max_batch=1)
    t1 = time.perf_counter()
    ready = pose.wait_compiled(timeout=600)
    return dict(load_s=loaded, warmup_s=warm, compile_s=time.perf_counter() - t1, ready=ready,
                switched_off=pose.switched_off)


def _env(tmp: str) -> dict[str, str]:
    """The runs' environment: offline, Ultralytics' settings and our cache in ``tmp``, this tree importable."""
    return dict(os.environ, HF_HUB_OFFLINE="1", YOLO_OFFLINE="1", PYTHONUNBUFFERED="1",
                YOLO_CONFIG_DIR=str(Path(tmp) / "yolo"), SAPIENS2_STREAM_CACHE=str(Path(tmp) / "cache"),
                PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "clients" / "python"),
                                            os.environ.get("PYTHONPATH", "")]))


def start_env(tmp: str) -> dict[str, str]:
    """The environment of a start: ``_env`` without Inductor's and Triton's cache folders, so that the first
    start compiles cold into <cache>/compile (ours) and the second finds it there. The worker has both set
    once it compiled (Inductor sets TRITON_CACHE_DIR in its process at its first Triton compile: the graphs
    phase's), and Triton's kept kernels would make the first start look cheap."""
    return {k: v for k, v in _env(tmp).items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}


def phase_starts(ctx: Ctx) -> None:
    """The first and the second start of a compiled run, each in a process of its own: the second finds the
    shape in Inductor's cache kept in <cache>/compile (the first of a session's runs on a new machine is
    the first start)."""
    import json

    size = ctx.model("0.4b")
    ctx.say(f"\n## Start-up of a compiled run (pose {size} x1, `--compile default`, a process each)\n")
    if ctx.smoke:
        ctx.mark_cuda_only("measured on CUDA: a cold Inductor compile costs this CPU minutes for figures that "
                           "mean nothing (tests/stages/sapiens2/test_compile_cli.py runs the first and second start "
                           "of the command)")
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="starts-") as tmp:
        env = start_env(tmp)
        for start in ("first start", "second start"):
            if ctx.left_s() < 20:
                ctx.say(f"({start} skipped: {ctx.left_s():.0f} s left of this phase)")
                break
            argv = [sys.executable, "-m", "bench.device_cli", "--compile-start", str(ctx.ckpt("pose")), str(ctx.device)]
            try:
                done = subprocess.run(guarded(argv), env=env, cwd=REPO, capture_output=True, text=True,
                                      timeout=ctx.left_s() - 10)
                result = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else \
                    dict(error=(done.stderr.strip().splitlines() or ["?"])[-1])
            except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
                result = dict(error=f"{type(exc).__name__}: {exc}")
            ctx.report.results.setdefault("starts", []).append(dict(start=start, **result))
            ctx.report.save()
            rows.append([start, result.get("load_s"), result.get("warmup_s"), result.get("compile_s"),
                         result.get("ready"), result.get("error") or ", ".join(result.get("switched_off", {})) or "-"])
    ctx.report.table(["start", "load s", "warm-up s (eager, CUDA graphs)", "compile s (background)", "compiled",
                      "error / switched off"], rows)


def phase_e2e(ctx: Ctx) -> None:
    """The real command on the demo clip (1280x720, 180 frames): the rows that answer the issue's targets."""
    _e2e(ctx, "e2e", TARGET_ROWS, "the rows that answer a target")


def phase_e2e_more(ctx: Ctx) -> None:
    """The real command on the demo clip: the other rows (full frame, each task alone, 4 sources of pose + seg)."""
    _e2e(ctx, "e2e_more", MORE_ROWS, "more rows")


def _e2e(ctx: Ctx, key: str, rows: tuple[Row, ...], which: str) -> None:
    size = ctx.model("0.4b")
    ctx.say(f"\n## End to end: `sapiens2-stream` on the demo clip, {which}, {size} checkpoints, "
            f"{ctx.device.type}, keypoints read over ZeroMQ\n")
    results = ctx.report.results.setdefault(key, [])
    not_run = ctx.report.results.setdefault(f"{key}_not_run", [])
    ctx.report.table_header(["run", "exit", "FPS per source", "capture->receive p50 ms", "p95 ms", "warm-up s",
                             "CLI's fps (all sources)", "fast paths switched off", "wall s (H200 estimate)",
                             "target / note"])
    with tempfile.TemporaryDirectory(prefix="e2e-") as tmp:
        env = _env(tmp)
        clip = None
        for row in rows:
            why = _not_now(ctx, row)
            if why is not None:
                not_run.append(dict(label=row.label, why=why))
                ctx.report.table_row([row.label, "not run", None, None, None, None, None, None,
                                      f"- ({row.estimate_s:.0f})", why])
                ctx.report.save()
                continue
            endpoint = f"tcp://127.0.0.1:{_free_port()}"
            limit = min(ROW_LIMIT * row.estimate_s, ctx.left_s() - 5)
            stop_when = more = None
            if row.until_compiled:
                clip = clip or write_demo_clip(Path(tmp) / "demo-3s.mp4")
                stop_when = functools.partial(_switched_all_now, row.tasks.split(","))
                more = functools.partial(compile_figures, tasks=row.tasks.split(","), sources=row.sources)
            argv = _command(ctx, row, endpoint, clip if row.until_compiled else None)
            result = run_row(row, argv, endpoint, env, limit, stop_when, more)
            results.append(result)
            ctx.report.save()
            ctx.report.table_row([row.label, result["rc"], result["fps_per_source"], result["p50_ms"],
                                  result["p95_ms"], result["warm_s"], result["cli_fps"],
                                  ", ".join(result["switched_off"]) or "none",
                                  f"{result['wall_s']:.0f} ({row.estimate_s:.0f})",
                                  result["error"] or (compile_note(result) if row.until_compiled else row.answers)
                                  or "-"])
    ctx.say("\nA file source delivers every frame as fast as the pipeline takes them: its latency includes the "
            "wait in the source's queue; the paced row (--realtime) shows a camera's. YOLO has random weights "
            "(its boxes are noise, up to 8 per frame): its cost is real. Every row is one process: start-up, "
            "loading and warm-up are in its wall time, not in its FPS.")
    failed = [r["label"] for r in results if r["rc"] != 0]
    if failed:
        raise RuntimeError(f"the command failed in {len(failed)} row(s): {', '.join(failed)} (log tails in the JSON)")


def _not_now(ctx: Ctx, row: Row) -> str | None:
    """Why a row does not run now, or None."""
    if ctx.smoke and row.until_compiled:
        return ("not run in the smoke run: Inductor compiles a shape in 30-45 s on this CPU, for figures that mean "
                "nothing (tests/bench/test_device_bench_plan.py runs how the row is watched and stopped; "
                "tests/stages/sapiens2/test_compile_cli.py runs --compile)")
    if ctx.smoke and row.label not in SMOKE_ROWS:
        return "not run in the smoke run (one row per phase runs there, the code path of every row)"
    if not ctx.smoke and ctx.left_s() - 5 < row.estimate_s:
        return f"skipped: {ctx.left_s():.0f} s left of this phase, it needs about {row.estimate_s:.0f} s"
    return None


if __name__ == "__main__":  # the compile-start child of compile_starts
    import json

    if len(sys.argv) == 4 and sys.argv[1] == "--compile-start":
        print(json.dumps(compile_start(sys.argv[2], sys.argv[3])), flush=True)
