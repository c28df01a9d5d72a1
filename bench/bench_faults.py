"""What survives real faults, in figures: frames kept after a SIGKILL of a recording run, a
subscriber's peak memory under an image bomb, and the pipeline's frame rate with no subscriber,
a reading one and a stopped one (SIGSTOP).

    .venv/bin/python -m bench.bench_faults [--json out.json]
    .venv/bin/python -m bench.bench_faults --repo /tmp/before   # another checkout, same environment

``--repo`` runs the command line and the subscriber of another checkout (e.g. a git worktree of
an older commit) with this environment, so one machine gives the before and after figures.

Every run is the CLI on the embedded demo clip (180 frames of 1280x720; ``--source`` another) with tiny
random-weight pose checkpoints and the full frame as the person box, on the CPU:
- kill: ``--record`` (.mp4 and .mkv) and ``--save-keypoints``; SIGKILL once the keypoint file has
  ``--kill-at`` frames; then the frames PyAV decodes from the recording against the frames the
  keypoint file holds.
- bomb: a Subscriber in a child process gets a seg message with a complete PNG of 30000x30000
  zeros (about 0.9 MB that decode to 0.9 GB), under the headers of the shared wire vectors' two
  bombs (declared small, declared large), then good messages; its peak RSS growth, and whether it
  survived.
- subscriber: ``--publish``; frames per second over the keypoint file's frames 100..178 (``--window``; its line
  count polled), with no subscriber, with ``subscribe --topic ""`` reading every topic, and with
  that subscriber stopped by SIGSTOP once it has read a message; ``--rounds`` interleaved runs of
  each, the median kept. Also the pipeline process's CPU time per frame (user + system, from
  /proc): the work a subscriber adds, which a loaded two-core machine's frame rate hides in noise.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = ["--fallback-tiny", "--tasks", "pose", "--detector", "full-frame", "--device", "cpu", "--no-progress"]
BOMBS = ("png_bomb_declared_large", "png_bomb_declared_small")


def environment(repo: Path, cache: Path) -> dict[str, str]:
    paths = [str(repo)] + ([str(repo / "clients" / "python")] if (repo / "clients" / "python").is_dir() else [])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1", "YOLO_OFFLINE": "1",
            "SAPIENS2_STREAM_CACHE": str(cache), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli.main", *map(str, args)]


def lines_in(path: Path) -> int:
    """Whole lines (ending in a newline) in a growing file."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout_s: float) -> float | None:
    """time.monotonic() when ``path`` first held ``n`` lines; None if the process ended or time ran out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if lines_in(path) >= n:
            return time.monotonic()
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    return None


def decodable_frames(path: Path) -> int:
    """Frames PyAV decodes from a (possibly cut) recording before the first error."""
    import av

    count = 0
    try:
        with av.open(str(path)) as container:
            for _ in container.decode(video=0):
                count += 1
    except (av.error.FFmpegError, OSError, ValueError, IndexError):
        pass
    return count


def kill_case(suffix: str, env: dict[str, str], tmp: Path, kill_at: int, source: str) -> dict:
    record, keypoints = tmp / f"kill{suffix}", tmp / f"kill{suffix}.jsonl"
    proc = subprocess.Popen(cli("--source", source, *RUN, "--record", record, "--save-keypoints", keypoints), env=env,
                            cwd=tmp,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    reached = wait_for_lines(keypoints, kill_at, proc, 600)
    proc.kill()
    err = proc.communicate()[1]
    if reached is None:
        raise SystemExit(f"the {suffix} run ended before {kill_at} frames:\n{err[-2000:]}")
    processed = lines_in(keypoints)
    return dict(case=f"SIGKILL while recording {suffix}", processed=processed,
                file_bytes=record.stat().st_size if record.exists() else None, kept=decodable_frames(record))


CHILD = """
import json, resource, sys, time
try:  # a checkout from before the client package (this environment has the client installed too)
    from pipeline.subscriber import Subscriber, ReceiveTimeout
except ImportError:
    from sapiens2_client.subscriber import Subscriber, ReceiveTimeout
sub = Subscriber(sys.argv[1], [""], max_message_bytes=64 * 2**20)
sub.recv(timeout_s=60)  # connected: the bomb that comes next is not lost to the slow joiner
print("ready", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
got, error, until, bombed = 0, None, time.monotonic() + 20, False
try:
    while got < 3 and time.monotonic() < until:
        try:
            msg = sub.recv(timeout_s=1)
            for picture in ("image", "classes", "alpha"):  # as a consumer would: a lazy decoder decodes now
                getattr(msg, picture, None)
            # messages from the bomb on (good ones queued before it do not count): the bomb itself where it is
            # taken (an older subscriber), else what comes once it was refused
            refused = sum(getattr(sub.stats, "skipped", {}).values())
            bombed = bombed or type(msg).__name__ != "StatusMessage" or refused > 0
            got += bombed
        except ReceiveTimeout:
            pass
except BaseException as exc:
    error = f"{type(exc).__name__}: {str(exc)[:120]}"
print(json.dumps({"rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "got": got, "error": error,
                  "stats": str(sub.stats)}),
      flush=True)
"""


def real_bomb(side: int = 30000) -> bytes:
    """A complete PNG of side x side 8-bit zeros: about 0.9 MB that decode to side^2 bytes (0.9 GB)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    packer, rows = zlib.compressobj(9), b"\x00" * ((side + 1) * 1000)  # filter byte + pixels, 1000 rows at a time
    body = b"".join(packer.compress(rows) for _ in range(side // 1000)) + packer.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def bomb_case(name: str, env: dict[str, str], png: bytes, tmp: Path) -> dict:
    """The shared vector's seg message ``name`` (its declared shape) carrying the complete bomb ``png``."""
    import zmq

    cases = {c["name"]: c for c in json.loads((REPO / "clients" / "vectors" / "vectors.json").read_text())["cases"]}
    bomb = [base64.b64decode(f) for f in cases[name]["frames"]][:2] + [png]
    good = next([base64.b64decode(f) for f in c["frames"]] for c in cases.values()
                if "error" not in c and base64.b64decode(c["frames"][0]).startswith(b"status."))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, f"tcp://127.0.0.1:{port}"], env=env, cwd=tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # cwd: not this checkout
    try:
        for _ in range(1200):  # until the child has one message (at most a minute)
            sock.send_multipart(good)
            if select.select([proc.stdout], [], [], 0.05)[0] or proc.poll() is not None:
                break
        baseline = int(proc.stdout.readline().split()[1])
        sock.send_multipart(bomb)
        for _ in range(500):
            if proc.poll() is not None:
                break
            sock.send_multipart(good)
            time.sleep(0.02)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close(linger=0)
        ctx.term()
    lines = out.strip().splitlines()
    report = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {"error": err.strip()[-200:]}
    grew = None if "rss_kb" not in report else (report["rss_kb"] - baseline) / 1024
    return dict(case=f"image bomb {name}", rss_growth_mb=grew, good_after=report.get("got"),
                survived=report.get("error") is None, error=report.get("error"), stats=report.get("stats"))


def rate_case(mode: str, env: dict[str, str], tmp: Path, first: int, last: int, source: str) -> dict:
    keypoints = tmp / f"rate-{mode}.jsonl"
    keypoints.unlink(missing_ok=True)  # an earlier round's
    port = free_port()
    proc = subprocess.Popen(cli("--source", source, *RUN, "--publish", f"tcp://127.0.0.1:{port}", "--save-keypoints",
                                keypoints), env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    sub = None
    try:
        if mode != "none":
            sub = subprocess.Popen(cli("subscribe", "--endpoint", f"tcp://127.0.0.1:{port}", "--topic", ""), env=env,
                                   cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            sub.stdout.readline()  # it has read a message: connected and subscribed
            if mode == "stopped":
                os.kill(sub.pid, signal.SIGSTOP)
            else:  # keep reading its output so it never blocks on a full pipe
                threading.Thread(target=sub.stdout.read, daemon=True).start()
        start = wait_for_lines(keypoints, first, proc, 600)
        cpu0 = cpu_seconds(proc.pid)
        end = wait_for_lines(keypoints, last, proc, 600)
        cpu1 = cpu_seconds(proc.pid)
        if start is None or end is None:
            raise SystemExit(f"the {mode} run ended early:\n{proc.communicate()[1][-2000:]}")
        proc.send_signal(signal.SIGINT)  # measured: the rest of the source is not needed
        proc.wait(600)
    finally:
        if sub is not None and sub.poll() is None:
            os.kill(sub.pid, signal.SIGCONT)
        for p in (proc, sub):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    return dict(case=f"subscriber: {mode}", fps=(last - first) / (end - start),
                cpu_ms_per_frame=1000 * (cpu1 - cpu0) / (last - first))


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) a process has used: the work it did, whatever else ran."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout whose CLI and subscriber run")
    ap.add_argument("--source", default="demo", help="what every run reads (the smoke test: a small clip)")
    ap.add_argument("--kill-at", type=int, default=60, help="frames in the keypoint file at the SIGKILL")
    ap.add_argument("--parts", default="kill,bomb,subscriber")
    ap.add_argument("--bomb-side", type=int, default=30000, help="pixels per side of the PNG bomb (a multiple of 1000)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each subscriber case (the median is kept)")
    ap.add_argument("--window", type=lambda t: tuple(map(int, t.split(","))), default=(100, 178),
                    help="FIRST,LAST: the frames the rate is taken over (the demo has 180; a stopped "
                         "subscriber's socket buffers take ~70 frames of 720p JPEG to fill)")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        env = environment(args.repo.resolve(), tmp / "cache")
        # (the first run makes the tiny checkpoints, before its first frame: they are there before any kill)
        source = args.source if args.source == "demo" else str(Path(args.source).resolve())
        if "kill" in parts:
            rows += [kill_case(suffix, env, tmp, args.kill_at, source) for suffix in (".mp4", ".mkv")]
        if "bomb" in parts:
            png = real_bomb(args.bomb_side)
            rows += [{**bomb_case(name, env, png, tmp), "png_kb": len(png) // 1024} for name in BOMBS]
        if "subscriber" in parts:  # interleaved rounds, the median of each (this machine's runs vary by ~10%)
            runs: dict[str, list[dict]] = {"none": [], "reading": [], "stopped": []}
            for _ in range(args.rounds):
                for mode, got in runs.items():
                    got.append(rate_case(mode, env, tmp, *args.window, source))

            def median(mode: str, key: str) -> float:
                return statistics.median(r[key] for r in runs[mode])

            rows += [dict(case=f"subscriber: {mode}", fps=median(mode, "fps"),
                          fps_runs=[round(r["fps"], 1) for r in got],
                          fps_vs_none=median(mode, "fps") / median("none", "fps"),
                          cpu_ms_per_frame=median(mode, "cpu_ms_per_frame"),
                          cpu_vs_none=median(mode, "cpu_ms_per_frame") / median("none", "cpu_ms_per_frame"))
                     for mode, got in runs.items()]
    print(f"checkout: {args.repo.resolve()}")
    for row in rows:
        print("  ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"repo": str(args.repo.resolve()), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
