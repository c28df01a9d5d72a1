"""The benchmarks must not rot between the runs that measure with them: run the one-call device
benchmark's CPU smoke mode, and every other benchmark in bench/ on tiny settings.

This checks that every phase runs on tiny models on the CPU and writes its report (or says that
what it measures needs CUDA), that the report carries the package versions and the correctness
thresholds, that the watchdog ends a phase that overruns its limit (its threads' tracebacks in the
log) while the next phases still run, and that one failing phase or a short time budget costs only
that phase. The numbers of a smoke run on tiny configs mean nothing and are not asserted beyond
being produced.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench import device_bench
from bench.device_cli import MORE_ROWS, TARGET_ROWS
from bench.devicewatch import Phase, Supervisor
from tests.cliutil import make_video

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", YOLO_OFFLINE="1", PYTHONUNBUFFERED="1",
           RAY_worker_niceness="0", RAY_USAGE_STATS_ENABLED="0")  # (conftest.py's cli_env says why)
CUDA_ONLY = {"syncs", "starts"}  # phases whose measurement needs CUDA: on the CPU they run their code path and say so
VERSIONED = ("torch", "torchvision", "transformers", "av", "zmq", "ultralytics", "lap", "cv2", "numpy", "msgpack",
             "safetensors")


def _env(tmp_path: Path) -> dict[str, str]:
    """ENV with a checkpoint cache of the test's own: a run that falls back to tiny checkpoints makes them
    there, never in the user's ~/.cache/sapiens2-stream."""
    return dict(ENV, SAPIENS2_STREAM_CACHE=str(tmp_path / "cache"))


def _bench(tmp_path: Path, *args: str, timeout: float,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.device_bench", "--smoke", "--out", str(tmp_path), *args],
                          env=env or _env(tmp_path), cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_device_bench_smoke_runs_every_phase(tmp_path: Path) -> None:
    # Started as a person would, not by device_run.sh: no folder for Ultralytics' settings or our cache given, and
    # a home of its own, which no process of the run (the workers, the commands of e2e) may write into.
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in _env(tmp_path).items() if k not in ("YOLO_CONFIG_DIR", "SAPIENS2_STREAM_CACHE")}
    ran = _bench(tmp_path, "--phases", "all", "--seconds", "0.5", timeout=380, env=dict(env, HOME=str(home)))
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert not any(home.rglob("*")), sorted(home.rglob("*"))
    report = (tmp_path / "device_bench.md").read_text()
    results = json.loads((tmp_path / "device_bench.json").read_text())
    # Every phase ran; the CUDA-only one ran its code path and says why its measurement needs CUDA.
    assert list(results["phases"]) == [p.name for p in device_bench.PHASES]
    for name, entry in results["phases"].items():
        if name in CUDA_ONLY:
            assert entry["status"] == "cuda-only" and "CUDA" in entry["note"], entry
        else:
            assert entry["status"] == "ok", (name, entry)
    assert "skipped in the smoke run" not in report and "n/a here (CUDA only)" in report
    assert results["errors"] == {} and results["skipped"] == []
    for heading in ("Versions", "Plan: time budget 510 s", "Checkpoints", "Correctness on the device", "Model forward",
                    "Eager vs CUDA graphs vs compiled",
                    "End to end: `sapiens2-stream` on the demo clip, the rows that answer a target",
                    "End to end: `sapiens2-stream` on the demo clip, more rows",
                    "Start-up of a compiled run", "Host synchronisations", "Our path vs the reference", "End to end",
                    "Fast-path switches", "Transfers and encoders", "Streams with a compiled pose stage",
                    "Many sources, one process", "## Phases"):
        assert heading in report, heading
    # Versions of every package the phases use, in both files.
    for package in VERSIONED:
        assert results["versions"][package] not in (None, "MISSING"), package
        assert re.search(rf"^\| {package} \| {re.escape(results['versions'][package])} \|", report, re.M), package
    # Correctness: decoded outputs against float32 with stated thresholds, pass/fail per row.
    thresholds = results["correctness_thresholds"]
    assert {"raw_rel_l2", "kp_dist_rel_crop", "seg_label_diff", "alpha_mean_abs"} <= set(thresholds)
    assert all(0 < t["float16"] < t["bfloat16"] for t in thresholds.values())
    assert "Thresholds (bf16 / fp16)" in report and "| raw_rel_l2 | 8.00e-02 | 1.00e-02 |" in report
    rows = results["correctness"]
    assert len(rows) == 6 and {(r["task"], r["dtype"]) for r in rows} == {
        (t, d) for t in ("pose", "seg", "matting") for d in ("bfloat16", "float16")}
    assert all(r["finite"] and r["passed"] for r in rows)
    assert {"kp_dist_rel_crop", "kp_score_rel"} <= set(next(r for r in rows if r["task"] == "pose")["checks"])
    assert "seg_label_diff" in next(r for r in rows if r["task"] == "seg")["checks"]
    assert all(c["value"] <= c["threshold"] and c["passed"] for r in rows for c in r["checks"].values())
    assert report.count("| pass |") == sum(len(r["checks"]) for r in rows)
    assert results["checkpoints"]["matting"]["label"].startswith("matting head on the tiny backbone")
    assert {r["batch"] for r in results["forward"]} == {1, 2, 4, 8}
    stages = {(r["stage"], r["path"]) for r in results["reference"]}
    assert ("pose x8", "image -> host result") in stages and ("seg", "image -> host result") in stages
    assert all(r["ref p50"] > 0 for r in results["reference"] if r["path"] == "image -> host result")
    assert len(results["pipeline"]) == 6 and all(r["fps"] > 0 and r["p95_ms"] > 0 for r in results["pipeline"])
    assert {(r["overlap"], r["pinned"]) for r in results["pipeline"]} == {(True, True), (False, True), (True, False)}
    assert all(r["detector_calls"] > 0 for r in results["pipeline"])  # the engine's detect_batch reached YOLO
    assert results["pipeline_detector"]["deprecation_warnings"] == 0
    many = results["sources"]  # N sources through one engine: every source had results, the step held them all
    assert [r["sources"] for r in many] == [1, 2] and all(r["fps_min_source"] > 0 for r in many)
    assert many[1]["frames_per_step"] > 1 and many[1]["vs_n_x_one"] > 0 and many[0]["pose_tflops"] > 0
    fast = {r["variant"]: r for r in results["fastpath"]}
    assert len(fast) == 8 and fast["3 persons, no buckets (batch 3)"]["batch"] == 3
    # every switch computes what the default computes (fp32 on the CPU: to rounding)
    assert all(r["max_rel_diff"] < 1e-4 for r in fast.values() if r["max_rel_diff"] is not None)
    encoders = [r for r in results["transfers"] if r["what"] == "video encode per frame"]
    assert [(r["variant"], r["ms"] is None) for r in encoders] == [("h264_nvenc (NVENC)", True),
                                                                   ("libx264 (CPU)", False)]
    assert encoders[0]["note"].startswith("n/a (no NVENC") and encoders[1]["note"].startswith("encoder used: libx264;")
    jpeg = [r for r in results["transfers"] if r["what"].startswith("JPEG") and r["ms"]]
    assert len(jpeg) == 1 and "decodes; mean abs error" in jpeg[0]["note"]  # CPU only here
    lifted = [r for r in results["transfers"] if r["what"].startswith("3D keypoints, 8 persons")]
    assert [r["variant"] for r in lifted] == ["window 1", "window 5"] and all(r["ms"] for r in lifted)
    assert results["compile"]["ready"] and results["compile"]["switched_off"] == {}
    # The paths a run takes: every case eager, with graphs (off on the CPU: eager again) and compiled, which
    # switched to its compiled forward after its check; nothing was switched off.
    graphs = {(r["path"], r["task"], r["batch"]): r for r in results["graphs"]}
    assert {(t, b) for _, t, b in graphs} == {("pose", 2), ("seg", 1)} and len(graphs) == 6  # the smoke's cases
    assert all(r["compiled_in_use"] for r in graphs.values() if r["path"].startswith("compiled"))
    assert all(r["switched_off"] == {} and r["ms"] for r in graphs.values())
    # The attention kernels of every path and case, each from the forward that path's graphs capture (on the
    # CPU the profiler names aten ops: the CPU's flash kernel here).
    for (path, _, _), r in graphs.items():
        kernels = r["attention_kernels"]
        assert kernels["profiled"] == ("compiled forward" if path.startswith("compiled") else "eager forward")
        assert kernels["names"] and kernels["by_backend"], r
    # The real command, one row of each of its phases: each run ended well, its keypoint messages came over
    # ZeroMQ, the CLI's own fps was read (one source and many), and every row not run says why.
    e2e = results["e2e"] + results["e2e_more"]
    assert [r["label"] for r in e2e] == ["pose, YOLO11n, 4 sources", "pose, full frame"]
    assert all(r["rc"] == 0 and r["messages"] > 0 and r["error"] is None and r["cli_fps"] > 0 for r in e2e), e2e
    assert all(r["warm_s"] is None or r["warm_s"] >= 0 for r in e2e)
    not_run = results["e2e_not_run"] + results["e2e_more_not_run"]
    assert len(not_run) + len(e2e) == len(TARGET_ROWS) + len(MORE_ROWS)
    assert all(r["why"].startswith("not run in the smoke run") and r["why"] in report for r in not_run)
    compiled = next(r for r in not_run if "--compile" in r["label"])  # Inductor on this CPU: too slow for CI
    assert "Inductor compiles a shape in 30-45 s" in compiled["why"]
    assert results["workers_started"] == 1


@pytest.mark.timeout(120)
def test_the_3d_step_benchmark_runs_and_reports_both_figures(tmp_path: Path) -> None:
    ran = subprocess.run([sys.executable, "-m", "bench.bench_keypoints3d", "--iters", "3", "--warmup", "1", "--frames",
                          "4", "--json", str(tmp_path / "k3.json")], env=_env(tmp_path), cwd=REPO,
                         capture_output=True, text=True, timeout=110)
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads((tmp_path / "k3.json").read_text())
    assert [r["window"] for r in out["cost"]] == [1, 3, 5] and all(r["p50_ms"] > 0 for r in out["cost"])
    assert [r["window"] for r in out["steadiness"]] == [1, 3, 5]
    assert all(0 < r["valid_%"] <= 100 and r["jitter_rms_cm"] >= 0 for r in out["steadiness"])


def _script(tmp_path: Path, name: str, *args: str, timeout: float) -> dict:
    """Run ``python -m bench.NAME`` from the repository root with ``--json``; its numbers."""
    out = tmp_path / f"{name}.json"
    ran = subprocess.run([sys.executable, "-m", f"bench.{name}", *args, "--json", str(out)],
                         env=_env(tmp_path), cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_archive_benchmark_runs_the_loop_and_the_batch_command(tmp_path: Path) -> None:
    out = _script(tmp_path, "bench_archive", "--videos", "2", "--frames", "4", "--workers", "1", timeout=280)
    assert [r["mode"] for r in out["results"]] == ["loop", "batch W=1"]
    for row in out["results"]:
        assert (row["videos"], row["failed"], row["frames"]) == (2, 0, 8), row
        assert row["frames_per_s"] > 0 and row["steady_vs_loop"] > 0
    assert (tmp_path / "cache" / "tiny" / "pose" / "model.safetensors").is_file()  # not in the user's ~/.cache


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_many_sources_benchmark_runs_batched_and_separate(tmp_path: Path) -> None:
    # two sources: batched, the one-source run it is compared with, and two separate processes (one more
    # row of one source would run the same code again, in a third process)
    out = _script(tmp_path, "bench_multisource", "--sources", "2", "--frames", "4", "--warmup", "1", "--threads",
                  "1", timeout=280)
    [row] = out["rows"]
    assert row["sources"] == 2 and row["batched"]["frames"] == 8 and row["batched"]["fps"] > 0
    assert row["separate"]["fps"] > 0 and row["batched"]["memory_mb"] > 0 and row["batched_vs_n_x_one"] > 0


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_the_fleet_benchmark_measures_overhead_and_a_failover(tmp_path: Path) -> None:
    # (the counting windows run the cameras unpaced: every second of them is a core's worth of CPU)
    out = _script(tmp_path, "bench_fleet", "--cameras", "2", "--warmup", "0.5", "--window", "2", "--failovers", "1",
                  "--standalone-runs", "1", timeout=460)
    assert out["fleet_fps"] > 0 and len(out["standalone_runs_fps"]) == 1 and out["fleet_vs_standalone"] > 0
    [failover] = out["failovers"]
    assert failover["moved"] >= 1 and 0 < failover["first_frame_max_s"] < 90


@pytest.mark.timeout(300)
def test_the_overhead_benchmark_times_every_part_and_gives_a_verdict(tmp_path: Path) -> None:
    out = _script(tmp_path, "bench_overhead", "--iters", "2", "--warmup", "1", "--threads", "1", timeout=280)
    parts = {row["part"] for row in out["rows"]}
    assert parts == {"decode", "upload", "plumbing", "device", "annotation", "encoding", "publishing"}
    measured = {row["measured"] for row in out["rows"]}
    # Every part the host keeps per frame (issue 34, item 6): detector pre/post, pose decode, annotation, JPEG for
    # publishing, recording.
    assert {"detector letterbox 1080p -> 384x640 (stages.detect.letterbox)", "detector NMS + scale_boxes (Ultralytics)",
            "pose decode, 1 person, 308 x 256x192 heatmaps (DARK-UDP)",
            "compose_annotators(seg, boxes, pose, hud) + frame copy", "JPEG encode q90 alone (cv2 RGB->BGR + imencode)",
            "ZmqPublisher.write, frames subscriber (JPEG q90 of annotated frame)",
            "VideoRecorder.write, libx264 veryfast crf 23",
            "VideoRecorder.write on the sink thread (libx264 on its own thread)"} <= measured
    # On the CPU only OpenCV's JPEG, and it says so (on CUDA nvJPEG, the run's default there, beside it).
    assert out["jpeg"]["paths"] == ["OpenCV"] and out["jpeg"]["default"] == "OpenCV"
    assert out["jpeg"]["notes"] and "OpenCV only here" in out["jpeg"]["notes"][0]
    assert not any("nvJPEG" in m for m in measured)
    summed = [row for row in out["rows"] if row["in sum"]]
    assert summed and all(row["p50 ms"] == row["p50 ms"] for row in summed)  # no NaN
    assert out["verdict"] in ("MET", "MISSED") and out["our_code_ms"] > 0 and out["target_ms"] == 5.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_stages_benchmark_compares_ours_and_the_reference_per_stage(tmp_path: Path) -> None:
    out = _script(tmp_path, "bench_stages", "--config", "tiny", "--persons", "1", "--iters", "1", "--warmup", "1",
                  "--frame", "240", "320", "--threads", "1", timeout=280)
    rows = {(r["stage"], r["path"]): r for r in out["rows"]}
    for stage in ("pose x1", "seg", "matting"):
        for path in ("model", "image -> host result"):
            assert rows[(stage, path)]["ours p50"] > 0 and rows[(stage, path)]["ref p50"] > 0, (stage, path)
    assert any(stage.startswith("frame (") for stage, _ in rows)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_pose_benchmark_runs_both_paths(tmp_path: Path) -> None:
    out = _script(tmp_path, "bench_pose_cpu", "--config", "tiny", "--persons", "1", "--iters", "1", "--warmup", "1",
                  "--threads", "1", timeout=280)
    [row] = out["rows"]
    assert row["persons"] == 1 and row["ours p50 ms"] > 0 and row["reference p50 ms"] > 0


@pytest.mark.timeout(300)
def test_the_publish_benchmark_times_no_reading_and_stopped_subscribers(tmp_path: Path) -> None:
    out = _script(tmp_path, "bench_publish", "--iters", "5", "--warmup", "2", timeout=280)
    assert [r["case"].split(" ")[0] for r in out["rows"]] == ["no", "one", "the"]
    assert all(r["p50 ms"] > 0 for r in out["rows"]) and out["stopped_dropped"] >= 0


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_faults_benchmark_measures_a_kill_a_bomb_and_the_subscriber_cases(tmp_path: Path) -> None:
    clip = make_video(tmp_path / "walk.mp4", 150, w=160, h=120)  # (the demo's 720p frames cost 10x as much)
    out = _script(tmp_path, "bench_faults", "--source", str(clip), "--kill-at", "10", "--rounds", "1", "--window",
                  "10,25", "--bomb-side", "8000", timeout=380)
    rows = {r["case"]: r for r in out["rows"]}
    for suffix in (".mp4", ".mkv"):
        kill = rows[f"SIGKILL while recording {suffix}"]
        assert kill["processed"] >= 10 and kill["kept"] > 0, kill  # what a SIGKILL leaves is playable
    for bomb in ("png_bomb_declared_large", "png_bomb_declared_small"):  # 8000x8000: 61 MB if decoded
        row = rows[f"image bomb {bomb}"]
        assert row["survived"] and row["rss_growth_mb"] < 30, row
        assert row["good_after"] == 3 and "skipped=Counter({'" in row["stats"], row  # it came, and was refused
    assert all(rows[f"subscriber: {mode}"]["fps"] > 0 for mode in ("none", "reading", "stopped"))


@pytest.mark.timeout(120)
def test_the_watchdog_ends_a_hung_phase_and_the_next_phases_run(tmp_path: Path) -> None:
    """_hang sleeps past its 2 s limit (faulthandler's exit ends it); _wedge disarms that timer
    (the parent's SIGABRT backstop ends it); transfers still runs, in a fresh worker."""
    ran = _bench(tmp_path, "--phases", "_hang,_wedge,transfers", timeout=110)  # a hang would time out
    assert ran.returncode == 1  # the two test phases count as errors
    results = json.loads((tmp_path / "device_bench.json").read_text())
    phases = results["phases"]
    assert list(phases) == ["_hang", "_wedge", "transfers"]
    assert phases["transfers"]["status"] == "ok" and results["transfers"]
    for name, how in (("_hang", "faulthandler dumped every thread"), ("_wedge", "the parent sent SIGABRT")):
        assert phases[name]["status"] == "killed" and how in phases[name]["error"], phases[name]
        assert phases[name]["seconds"] < 15
        assert "the main thread was in _sleep_past_the_deadline (bench/device_bench.py:" in phases[name]["error"]
        dump = results["errors"][name]
        assert "_sleep_past_the_deadline" in dump and f"phase_test{name}" in dump
        assert f"=== watchdog: phase {name} killed" in ran.stderr  # the dump is in the log, too
    assert results["errors"]["_hang"].startswith("Timeout (0:00:02)!")
    assert len(re.findall(r"^Thread 0x", results["errors"]["_hang"], re.M)) >= 2  # every thread, the helper too
    assert results["workers_started"] == 3  # a new worker after each ended one
    report = (tmp_path / "device_bench.md").read_text()
    assert "**phase `_hang` ended by the watchdog**" in report and "## Transfers and encoders" in report


def _ctx(tmp_path: Path, budget_s: float) -> device_bench.Ctx:
    return device_bench.Ctx(torch.device("cpu"), True, 1, 1.0, time.monotonic() + budget_s,
                            device_bench.Report(tmp_path))


def test_a_failing_phase_is_reported_and_the_next_one_runs(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, 60)

    def broken(c):
        c.say("## half done")
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    outcome = device_bench.run_phase(ctx, "broken", broken, 0)
    assert outcome.status == "failed" and outcome.restart  # a CUDA error: the worker must not go on
    device_bench.run_phase(ctx, "fine", lambda c: c.say("## fine ran"), 0)
    report = (tmp_path / "device_bench.md").read_text()  # written after each phase, not only at the end
    assert "## half done" in report and "## fine ran" in report
    assert "**phase `broken` failed**: RuntimeError: CUDA error: an illegal memory access" in report
    results = json.loads((tmp_path / "device_bench.json").read_text())
    assert set(results["errors"]) == {"broken"} and "illegal memory access" in results["errors"]["broken"]
    assert results["phases"]["fine"]["status"] == "ok"
    assert not device_bench.run_phase(ctx, "value", lambda c: int("x"), 0).restart  # other errors: go on


def test_a_phase_that_would_overrun_the_budget_is_skipped_and_says_so(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, 10)
    device_bench.run_phase(ctx, "compile", lambda c: pytest.fail("should not run"), 120)
    assert "phase `compile` skipped" in (tmp_path / "device_bench.md").read_text()
    assert json.loads((tmp_path / "device_bench.json").read_text())["skipped"] == ["compile"]


def test_the_supervisor_skips_what_no_longer_fits_without_starting_a_worker(tmp_path: Path) -> None:
    report = device_bench.Report(tmp_path)
    config = dict(device="cpu", smoke=False, iters=1, seconds=1.0, ckpts={}, state_dir=str(tmp_path / "w"),
                  phases_module="bench.device_bench")
    supervisor = Supervisor(report, config, smoke=False)
    supervisor.run([Phase("compile", lambda c: pytest.fail("should not run"), 120, 200)], time.monotonic() + 10)
    assert supervisor.workers_started == 0 and report.results["skipped"] == ["compile"]
    assert "it needs about 120 s" in report.results["phases"]["compile"]["note"]


@pytest.mark.parametrize("task", ["pose", "seg", "matting"])
def test_the_checkpoints_phase_makes_random_inits_weights(task: str) -> None:
    """The bench's meta-built init (on the GPU there) is random_init's scheme, call for call."""
    from bench.device_model import random_model
    from stages.sapiens2.model import Sapiens2
    from stages.sapiens2.tiny import random_init, tiny_config

    ours = random_model(tiny_config(task), "cpu").state_dict()
    theirs = random_init(Sapiens2(tiny_config(task)), seed=1).state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_phase_order_estimates_and_selection() -> None:
    names = [p.name for p in device_bench.PHASES]
    assert names[0] == "checkpoints" and names.index("compile") < names.index("fastpath") < names.index("transfers")
    assert device_bench.DEFAULT == names[:len(device_bench.DEFAULT)]  # what a call without --phases runs
    assert {"correctness", "forward", "graphs", "e2e", "pipeline", "reference", "sources"} <= set(device_bench.DEFAULT)
    # The default phases' estimates fit the budget with room (the first worker's start, ~5 s, comes on top);
    # the others fit a second call's.
    by_name = {p.name: p for p in device_bench.PHASES}
    assert sum(by_name[n].estimate_s for n in device_bench.DEFAULT) <= 0.85 * device_bench.BUDGET_S
    # The others, in the reruns of RERUNS: each (its checkpoints rebuilt first) within its budget.
    rest = {p.name for p in device_bench.PHASES if p.name not in device_bench.DEFAULT}
    assert {name for rerun in device_bench.RERUNS for name in rerun} == rest
    for rerun in device_bench.RERUNS:
        needs = by_name["checkpoints"].estimate_s + sum(by_name[name].estimate_s for name in rerun)
        assert needs <= 0.85 * device_bench.RERUN_BUDGET_S, (rerun, needs)
    # The real command's rows: those that answer a target run in the default call; a phase's estimate is its rows'.
    assert "e2e" in device_bench.DEFAULT and "e2e_more" in rest
    assert by_name["e2e"].estimate_s == sum(r.estimate_s for r in TARGET_ROWS)
    assert by_name["e2e_more"].estimate_s == sum(r.estimate_s for r in MORE_ROWS)
    assert [r.label for r in TARGET_ROWS[:2]] == ["pose + seg, YOLO11n", "pose, YOLO11n, 4 sources"]
    assert all(p.estimate_s < p.limit_s for p in device_bench.PHASES)
    chosen, unknown = device_bench.select("forward,_hang")
    assert [p.name for p in chosen] == ["_hang", "checkpoints", "forward"] and unknown == []
    assert device_bench.select("transfers,nope") == ([p for p in device_bench.PHASES if p.name == "transfers"],
                                                     ["nope"])


def test_the_documented_device_call_and_budget() -> None:
    """device_run.sh: 510 s budget under a 540 s limit that counts the wheel install; the call's 570 s;
    Ultralytics' settings and the caches in folders of the run, never in the home."""
    script = (REPO / "bench" / "device_run.sh").read_text()
    assert 'run(command="bash bench/device_run.sh", carry=[".whl"], timeout_s=570)' in script
    assert "LIMIT_S=${LIMIT_S:-540}" in script and "BUDGET_S=${BUDGET_S:-510}" in script
    assert "YOLO_CONFIG_DIR=/tmp/" in script and "SAPIENS2_STREAM_CACHE=/tmp/" in script
    assert script.index('timeout -k 5 "$LIMIT_S" python3 -m pip install') < script.index("LEFT=$((LIMIT_S - SECONDS))")
    assert '--budget-s "$BUDGET"' in script
    for path in ("device_bench.py", "devicewatch.py", "devicekit.py"):
        assert "timeout_s=580" not in (REPO / "bench" / path).read_text()
    assert 'timeout_s=570' in (REPO / "bench" / "device_bench.py").read_text()


def test_bench_code_never_passes_half_to_ultralytics() -> None:
    """Ultralytics deprecated ``half`` (it warned on every frame): only PersonDetector's own argument,
    which it turns into ``quantize=16``, may be called half."""
    for path in (REPO / "bench").glob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bhalf\s*=", line):
                assert "PersonDetector(" in line, f"{path.name}:{number}: {line.strip()}"


def test_sync_sites_name_the_line_of_our_code_that_synchronised() -> None:
    import warnings

    def our_stage() -> None:  # stands in for a line of stages/ or pipeline/ calling a syncing op
        warnings.warn("called a synchronizing CUDA operation", UserWarning)

    def caller() -> None:
        our_stage()
        our_stage()
        warnings.warn("something else", UserWarning)

    sites = device_bench.sync_sites(caller, ours=(__file__,))
    line = our_stage.__code__.co_firstlineno + 1
    assert sites == {f"tests/bench/test_bench_smoke.py:{line}": 2}
