"""Fleet overhead and failover time, on a local multi-node Ray cluster (ray.cluster_utils.Cluster: a
head and two worker nodes that declare one logical GPU each; on a GPU host give them real GPUs).

    .venv/bin/python -m bench.bench_fleet                   # tiny pose model on the CPU
    .venv/bin/python -m bench.bench_fleet --cameras 4 --window 30 --failovers 3

Overhead: the same N looping cameras (not paced: as fast as the pipeline goes) through (a) the
standalone pipeline (`sapiens2-stream --source ... --publish-connect BROKER`, one process) and (b) a
fleet of one GPU actor; both publish into the same broker, and a subscriber counts the keypoint
messages over a window after a warm-up. Printed: frames per second of each and the ratio.
Failover: a fleet of two GPU actors with the cameras paced at their frame rate; the node holding
most cameras is removed without grace; the time from the removal to each moved camera's first frame
on the survivor, as the subscriber sees it (capture time), and the outage the fleet itself reports.
A node is added back before each further failover (Ray restarts the lost GPU actor there).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import av
import numpy as np
import yaml
from sapiens2_client.messages import KeypointsMessage
from sapiens2_client.subscriber import ReceiveTimeout, Subscriber

from bench.failover import first_frames_after, latest_indices
from bench.harness import dump_json, table
from pipeline.cluster.fleet import NAMESPACE, controller_name
from pipeline.net.broker import Broker

CLI = [str(Path(sys.executable).parent / "sapiens2-stream")]


def make_clip(path: Path, n: int = 30, w: int = 160, h: int = 120, fps: int = 15) -> Path:
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for i in range(n):
            image = np.full((h, w, 3), 40, np.uint8)
            image[h // 4: 3 * h // 4, (i * 4) % (w - 40):(i * 4) % (w - 40) + 40] = (230, 160, 60)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(folder: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--bind", "127.0.0.1", "--port",
                             str(port), "--save", "", "--appendonly", "no", "--dir", str(folder)],
                            stdout=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.1)
    return proc, f"redis://127.0.0.1:{port}/0"


def count_rate(sub: Subscriber, cameras: set[str], warmup_s: float, window_s: float,
               proc: subprocess.Popen | None = None) -> float:
    """Keypoint messages per second over ``window_s`` once every camera has sent and ``warmup_s`` passed."""
    seen: set[str] = set()
    deadline = time.monotonic() + 300
    while seen != cameras:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the standalone pipeline exited ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no keypoints from {sorted(cameras - seen)} within 300 s")
        try:
            msg = sub.recv(timeout_s=1.0)
        except ReceiveTimeout:
            continue
        if isinstance(msg, KeypointsMessage):
            seen.add(msg.meta.source_id)
    end_warm = time.monotonic() + warmup_s
    while time.monotonic() < end_warm:
        try:
            sub.recv(timeout_s=0.2)
        except ReceiveTimeout:
            pass
    count, start = 0, time.monotonic()
    while time.monotonic() - start < window_s:
        try:
            msg = sub.recv(timeout_s=0.2)
        except ReceiveTimeout:
            continue
        count += isinstance(msg, KeypointsMessage) and msg.meta.source_id in cameras
    return count / (time.monotonic() - start)


def pipeline_settings(tiny: Path) -> dict:
    return {"tasks": ["pose"], "detector": "full-frame", "fallback_tiny": True, "device": "cpu",
            "dtype": "float32", "checkpoints": {"pose": str(tiny)}}


def fleet_cli(args: list[str], env: dict, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([*CLI, "fleet", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"fleet {' '.join(args[:1])} failed: {done.stderr.strip()}")
    return done


def run_standalone(cameras: list[str], clip: Path, tiny: Path, broker: Broker, sub: Subscriber, env: dict,
                   folder: Path, warmup_s: float, window_s: float) -> float:
    """Frames per second of the plain pipeline on the same cameras, publishing into the same broker."""
    flags = [f"--source={c}=loop:{clip}" for c in cameras]
    proc = subprocess.Popen([*CLI, *flags, "--publish-connect", broker.xsub_endpoint, "--tasks", "pose",
                             "--detector", "full-frame", "--fallback-tiny", "--device", "cpu", "--dtype",
                             "float32", "--checkpoint", f"pose={tiny}", "--no-progress"],
                            env=env, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        return count_rate(sub, set(cameras), warmup_s, window_s, proc)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        drain(sub)


def drain(sub: Subscriber) -> None:
    try:
        while True:
            sub.recv(timeout_s=0.5)
    except ReceiveTimeout:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cameras", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after the first frames")
    parser.add_argument("--window", type=float, default=20.0, help="seconds counted")
    parser.add_argument("--failovers", type=int, default=2)
    parser.add_argument("--standalone-runs", type=int, choices=(1, 2), default=2,
                        help="standalone runs: before and after the fleet's (2), or before only (1: a smoke run)")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from stages.sapiens2.tiny import make_tiny

    folder = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "YOLO_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "OMP_NUM_THREADS": "1", "SAPIENS2_STREAM_CACHE": str(folder / "cache")}
    os.environ.update(env)
    tiny = Path(make_tiny(folder / "tiny-pose", "pose"))
    clip = make_clip(folder / "clip.mp4")
    cameras = [f"cam{i}" for i in range(args.cameras)]
    redis_proc, redis_url = start_redis(folder)
    results: dict = {"cameras": args.cameras, "window_s": args.window}
    cluster = None
    with Broker("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as broker:
        sub = Subscriber(broker.xpub_endpoint, ["keypoints"])
        try:
            # The Ray cluster is up (idle) for every measurement, so its own processes load all alike.
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0,
                                                                    "include_dashboard": False})
            nodes = [cluster.add_node(num_cpus=1, num_gpus=1) for _ in range(2)]
            ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
            settings = pipeline_settings(tiny)
            standalone = [run_standalone(cameras, clip, tiny, broker, sub, env, folder, args.warmup, args.window)]
            # (b) the same cameras on a fleet of one GPU actor
            spec = {"name": "bench", "broker": broker.xsub_endpoint, "redis": redis_url, "capacity": args.cameras,
                    "gpus": 1, "pipeline": settings,
                    "cameras": [{"id": c, "uri": f"loop:{clip}"} for c in cameras]}
            (folder / "one.yaml").write_text(yaml.safe_dump(spec))
            common = ["--address", cluster.address, "--name", "bench"]
            fleet_cli(["up", str(folder / "one.yaml"), "--address", cluster.address, "--detach"], env, folder)
            results["fleet_fps"] = count_rate(sub, set(cameras), args.warmup, args.window)
            fleet_cli(["down", *common], env, folder)
            drain(sub)
            if args.standalone_runs == 2:
                standalone.append(run_standalone(cameras, clip, tiny, broker, sub, env, folder, args.warmup,
                                                 args.window))
            results["standalone_runs_fps"] = standalone  # before (and after) the fleet run
            results["standalone_fps"] = sum(standalone) / len(standalone)
            results["fleet_vs_standalone"] = results["fleet_fps"] / results["standalone_fps"]

            # failover: two GPU actors, paced cameras
            spec.update(name="failover", gpus=2, capacity=args.cameras,
                        cameras=[{"id": c, "uri": f"loop:{clip}", "realtime": True} for c in cameras])
            (folder / "two.yaml").write_text(yaml.safe_dump(spec))
            common = ["--address", cluster.address, "--name", "failover"]
            fleet_cli(["up", str(folder / "two.yaml"), "--address", cluster.address, "--detach"], env, folder)
            failovers, recorded = [], 0
            for round_ in range(args.failovers):
                status = wait_all_alive("failover")
                victim = max(status["workers"], key=lambda w: len(w["cameras"]))
                node = next(n for n in nodes if n.node_id == victim["node"])
                last = latest_indices(sub, set(victim["cameras"]))
                lost_ns = time.time_ns()
                cluster.remove_node(node, allow_graceful=False)
                nodes.remove(node)
                first = first_frames_after(sub, lost_ns, last, 300.0)
                seen = {c: (ns - lost_ns) / 1e9 for c, ns in first.items()}
                recorded += len(victim["cameras"])
                status = wait_outages("failover", recorded)
                reported = {o["camera"]: o["outage_s"] for o in status["outages"][: len(victim["cameras"])]}
                failovers.append({"round": round_ + 1, "moved": len(seen), "first_frame_max_s": max(seen.values()),
                                  "first_frame_mean_s": sum(seen.values()) / len(seen),
                                  "reported_outage_max_s": max(reported.values()) if reported else None})
                if round_ + 1 < args.failovers:  # a node for the next round (Ray restarts the lost actor there)
                    nodes.append(cluster.add_node(num_cpus=1, num_gpus=1))
            results["failovers"] = failovers
            fleet_cli(["down", *common], env, folder)
        finally:
            sub.close()
            ray.shutdown()
            if cluster is not None:
                cluster.shutdown()
            redis_proc.terminate()
    print(f"fleet overhead, {args.cameras} looping cameras (160x120, tiny pose, CPU), {args.window:.0f} s window:")
    print(table([{"run": "standalone pipeline", "fps": results["standalone_fps"]},
                 {"run": "fleet, 1 GPU actor", "fps": results["fleet_fps"]},
                 {"run": "fleet / standalone", "fps": results["fleet_vs_standalone"]}]))
    print("\nfailover (node removed without grace -> first frame of each moved camera on the survivor):")
    print(table(results["failovers"]))
    if args.json:
        dump_json(args.json, results)
    shutil.rmtree(folder, ignore_errors=True)


def fleet_status(name: str) -> dict:
    """What `fleet status --json` prints, asked over this driver's own Ray connection (a CLI process per
    poll would start a Ray client each time, seconds of CPU that the fleet being measured shares)."""
    import ray

    return ray.get(ray.get_actor(controller_name(name), namespace=NAMESPACE).status.remote(), timeout=60)


def wait_outages(name: str, count: int) -> dict:
    """The fleet status once it has recorded ``count`` outages in all."""
    deadline = time.monotonic() + 120
    while True:
        status = fleet_status(name)
        if len(status["outages"]) >= count or time.monotonic() > deadline:
            return status
        time.sleep(0.5)


def wait_all_alive(name: str) -> dict:
    deadline = time.monotonic() + 300
    while True:
        status = fleet_status(name)
        if all(w["alive"] for w in status["workers"]) and all(c["status"] == "running" for c in status["cameras"]):
            return status
        if time.monotonic() > deadline:
            raise SystemExit(f"the fleet did not settle: {status}")
        time.sleep(0.25)  # (one status call over this driver's connection: cheap; the cameras run meanwhile)


if __name__ == "__main__":
    try:
        main()
    except TimeoutError as exc:  # a camera that never came (back): one line
        raise SystemExit(str(exc)) from None
