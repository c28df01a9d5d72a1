"""The network side under faults: rogue publishers against the real subscriber CLI, an image bomb and an
oversized message against memory, CURVE and the broker from the command line, keys that are never
replaced, and a subscriber that waits for nothing."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from pipeline.sinks.publisher import ZmqPublisher
from sapiens2_client import wire
from sapiens2_client.keys import CurveServerKeys
from stages.types import Detections, Frame, FrameResult, Keypoints, StreamInfo
from tests.cliutil import CLI, OFFLINE, run_cli_cases

pytestmark = pytest.mark.timeout(180)
VECTORS = json.loads((Path(__file__).resolve().parents[3] / "clients" / "vectors" / "vectors.json").read_text())
BAD = {c["name"]: [base64.b64decode(f) for f in c["frames"]] for c in VECTORS["cases"] if "error" in c}
GOOD_STATUS = wire.encode("status", "cam0", {"fps": 1.0, "health": "ok", "frames": 1, "last_frame_index": 0,
                                             "drops": {}}, publish_ns=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list, **kw) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _rogue() -> tuple[zmq.Context, zmq.Socket, str]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.linger = 0
    sock.bind("tcp://127.0.0.1:*")
    return ctx, sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


@contextlib.contextmanager
def _subscribed_to_rogue(*args: object) -> Iterator[tuple[zmq.Socket, subprocess.Popen]]:
    """A rogue publisher and ``sapiens2-stream subscribe --endpoint ITS_ENDPOINT *args`` on it; on
    leaving, the subscriber is killed if it still runs and the publisher is closed."""
    ctx, sock, endpoint = _rogue()
    proc = _start(["subscribe", "--endpoint", endpoint, *args])
    try:
        yield sock, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
        ctx.term()


def _until_joined(sock: zmq.Socket, proc: subprocess.Popen, marker: list[bytes]) -> None:
    """Send ``marker`` until the subscriber process prints something (slow-joiner safe)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sock.send_multipart(marker)
        if select.select([proc.stdout], [], [], 0.1)[0]:
            return
        assert proc.poll() is None, proc.communicate()[1]
    raise AssertionError("the subscriber never received anything")


def test_subscriber_cli_survives_every_malformed_message() -> None:
    with _subscribed_to_rogue("--topic", "", "--json", "--count", "3", "--timeout", "30") as (sock, proc):
        _until_joined(sock, proc, GOOD_STATUS)
        for frames in BAD.values():
            sock.send_multipart(frames)
        for _ in range(20):
            sock.send_multipart(GOOD_STATUS)
            time.sleep(0.01)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]  # strict JSON: never NaN
    assert len(lines) == 3 and all(line["topic"] == "status.cam0" for line in lines)
    assert "Traceback" not in err
    assert "skipped" in err  # the refusals were counted and reported


def _peak_rss_of_subscriber(frames: list[bytes], limit_mb: float = 64.0) -> tuple[int, dict, int]:
    """Run a Subscriber in a child process, send ``frames`` once it receives, then good messages; returns how
    much the child's peak RSS grew after it was ready (kB), its skip counts and how many good messages it got
    after ``frames`` were refused."""
    ctx, sock, endpoint = _rogue()
    code = f"""
import json, resource, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[3] / "clients" / "python")!r})
from sapiens2_client.subscriber import Subscriber, ReceiveTimeout
sub = Subscriber({endpoint!r}, [""], max_message_bytes=int({limit_mb} * 2**20))
got = 0
sub.recv(timeout_s=60)  # connected and subscribed: what comes next is not lost to the slow joiner
print("ready", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
while got < 3:  # good messages after the bad one was refused (good ones queued before it do not count)
    try:
        sub.recv(timeout_s=30)
        got += bool(sum(sub.stats.skipped.values()) or sub.stats.disconnects)
    except ReceiveTimeout:
        break
print(json.dumps({{"rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "skipped": dict(sub.stats.skipped),
                  "got": got, "disconnects": sub.stats.disconnects, "reconnects": sub.stats.reconnects}}), flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not select.select([proc.stdout], [], [], 0.05)[0]:  # good messages until it has one
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            sock.send_multipart(GOOD_STATUS)
        ready = proc.stdout.readline().split()
        assert ready[0] == "ready", ready
        baseline_kb = int(ready[1])
        sock.send_multipart(frames)
        for _ in range(200):
            sock.send_multipart(GOOD_STATUS)
            time.sleep(0.02)
            if proc.poll() is not None:
                break
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
        ctx.term()
    assert proc.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    return (report["rss_kb"] - baseline_kb, {**report["skipped"], "disconnects": report["disconnects"],
                                             "reconnects": report["reconnects"]}, report["got"])


def test_an_image_bomb_costs_no_memory() -> None:
    """875 KB of PNG that decodes to 30000x30000 pixels: refused from its header, never decoded."""
    bomb = BAD["png_bomb_declared_large"]
    rss_kb, skipped, got = _peak_rss_of_subscriber(bomb)
    assert got == 3 and skipped.get("too_large", 0) + skipped.get("shape", 0) >= 1, skipped
    assert rss_kb < 100_000, f"peak RSS grew {rss_kb / 1024:.0f} MB: the bomb was decoded"


def test_an_oversized_message_is_refused_while_it_arrives() -> None:
    """A 96 MB frame against a 16 MB limit: libzmq drops the connection instead of buffering it."""
    big = [b"status.cam0", GOOD_STATUS[1], b"\0" * (96 * 2**20)]
    rss_kb, skipped, got = _peak_rss_of_subscriber(big, limit_mb=16)
    # dropped; libzmq never connects again after that protocol error: the subscriber did, and went on
    assert got == 3 and skipped["disconnects"] >= 1 and skipped["reconnects"] >= 1, skipped
    assert rss_kb < 50_000, f"peak RSS grew {rss_kb / 1024:.0f} MB: the oversized message was received"


def _printed_until(sock: zmq.Socket, proc: subprocess.Popen, source_id: str, lines: list[dict]) -> None:
    """Send a status of ``source_id`` until the subscriber (``--json``) prints one; what it printed goes to
    ``lines``. Messages sent before it on the same connection were taken first."""
    marker = wire.encode("status", source_id, {"fps": 1.0, "health": "ok", "frames": 1, "last_frame_index": 0,
                                               "drops": {}}, publish_ns=1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sock.send_multipart(marker)
        while select.select([proc.stdout], [], [], 0.1)[0]:
            line = proc.stdout.readline()
            assert line, proc.communicate()[1]  # it ended
            lines.append(json.loads(line))
            if lines[-1]["topic"] == f"status.{source_id}":
                return
        assert proc.poll() is None, proc.communicate()[1]
    raise AssertionError(f"the subscriber never printed status.{source_id}")


@pytest.mark.parametrize("command", [[*CLI, "subscribe"], [str(Path(sys.executable).parent / "sapiens2-client"),
                                                           "subscribe"]], ids=["sapiens2-stream", "sapiens2-client"])
def test_the_summary_line_counts_refusals_by_reason_and_the_dropped_connection(command: list[str]) -> None:
    """The line a subscription ends with, as printed: what was refused and why, and the connection an
    oversized message cost (made again by the subscriber: libzmq would not)."""
    ctx, sock, endpoint = _rogue()
    proc = subprocess.Popen([*command, "--endpoint", endpoint, "--topic", "", "--json", "--max-message-mb", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[dict] = []
    try:
        _printed_until(sock, proc, "cam0", lines)
        for name in ("wrong_schema", "header_not_msgpack", "shape_negative", "shape_negative"):
            sock.send_multipart(BAD[name])
        _printed_until(sock, proc, "cam1", lines)  # the four refused before it
        sock.send_multipart([b"status.cam0", GOOD_STATUS[1], b"\0" * (2 * 2**20)])  # 2 MB over a 1 MB limit
        _printed_until(sock, proc, "cam2", lines)  # connected again
        proc.send_signal(signal.SIGINT)
        lines += [json.loads(line) for line in proc.stdout.read().splitlines()]
        err = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
        ctx.term()
    assert proc.returncode == 0, err
    last = err.strip().splitlines()[-1]
    summary = re.fullmatch(r"received (\d+), skipped 4 \((.*)\), missed 0, "
                           r"disconnects 1 \(1 after a message over --max-message-mb 1\)", last)
    assert summary, last
    assert int(summary[1]) == len(lines), f"{len(lines)} printed: {last}"
    reasons = dict(reason.split() for reason in summary[2].split(", "))
    assert reasons == {"shape": "2", "schema": "1", "header": "1"}, last


# -- subscribe waits for nothing -------------------------------------------------------------
def test_subscribe_against_nothing_says_why_and_fails(tmp_path: Path) -> None:
    proc = _start(["subscribe", "--endpoint", f"tcp://127.0.0.1:{_free_port()}", "--timeout", "1"])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert "waiting for messages" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: nothing received") and "--publish" in last and "CURVE" in last


def test_subscribe_without_keys_against_curve_fails_and_the_publisher_warns(tmp_path: Path, caplog) -> None:
    keys = tmp_path / "keys"
    assert subprocess.run([*CLI, "keys", keys], capture_output=True, timeout=60).returncode == 0
    pub = ZmqPublisher("tcp://127.0.0.1:*", curve=CurveServerKeys.from_dir(keys), status_interval_s=0.1)
    pub.open(StreamInfo("cam0", 8, 8, 30.0, Fraction(1, 30), live=True))
    try:
        with caplog.at_level("WARNING", "pipeline.sinks.publisher"):
            proc = _start(["subscribe", "--endpoint", pub.endpoint, "--topic", "status", "--timeout", "2"])
            out, err = proc.communicate(timeout=60)
            deadline = time.monotonic() + 10
            while "handshake" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        pub.close()
    assert proc.returncode == 3 and "CURVE" in err.strip().splitlines()[-1], err
    assert "handshake" in caplog.text  # the refused subscriber is visible on the publisher's side


# -- keys ------------------------------------------------------------------------------------
def test_keys_are_added_never_replaced(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    first = subprocess.run([*CLI, "keys", keys, "--client", "alice"], capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    server = (keys / "server.key_secret").read_bytes()
    alice = (keys / "clients" / "alice.key_secret").read_bytes()
    again = subprocess.run([*CLI, "keys", keys, "--client", "bob"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert (keys / "server.key_secret").read_bytes() == server  # the server key stays
    assert (keys / "authorized" / "bob.key").is_file() and (keys / "authorized" / "alice.key").is_file()
    # the same command again, with a new name: alice keeps her keys, carol gets hers
    more = subprocess.run([*CLI, "keys", keys, "--client", "alice", "--client", "carol"], capture_output=True,
                          text=True, timeout=60)
    assert more.returncode == 0, more.stderr
    assert "(carol)" in more.stdout and "kept the existing keys of alice" in more.stdout, more.stdout
    assert (keys / "clients" / "alice.key_secret").read_bytes() == alice
    assert (keys / "authorized" / "carol.key").is_file() and (keys / "server.key_secret").read_bytes() == server


# -- the broker from the command line --------------------------------------------------------
def _broker(args: list) -> tuple[subprocess.Popen, str, str]:
    proc = _start(["broker", *args])
    line = proc.stdout.readline()  # "broker: publishers -> EP, subscribers -> EP"
    assert line.startswith("broker:"), proc.communicate()[1]
    return proc, line.split("-> ")[1].split(",")[0], line.split("-> ")[2].strip()


@pytest.mark.parametrize("curve", [False, True])
def test_pipeline_publishes_through_the_broker_from_the_cli(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                                           curve: bool) -> None:
    keys = tmp_path / "keys"
    key_args: list = []
    if curve:
        ran = subprocess.run([*CLI, "keys", keys, "--client", "pipeline", "--client", "viewer"], capture_output=True,
                             text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        key_args = ["--curve-dir", keys]
    broker, xsub, xpub = _broker(["--xsub", "tcp://127.0.0.1:0", "--xpub", "tcp://127.0.0.1:0", *key_args])
    pipeline = _start(["--source", "demo", "--realtime", "--tasks", "pose", *OFFLINE, "--source-id", "cam3",
                       "--publish-connect", xsub, *key_args, "--curve-client", "pipeline"], env=cli_env, cwd=tmp_path)
    try:
        sub_keys = ["--keys", keys, "--client-name", "viewer"] if curve else []
        sub = _start(["subscribe", "--endpoint", xpub, "--count", "3", "--timeout", "90", *sub_keys])
        out, err = sub.communicate(timeout=150)
        assert sub.returncode == 0, err + pipeline.stderr.read() if pipeline.poll() is not None else err
        assert [line.split()[0] for line in out.splitlines()] == ["keypoints.cam3"] * 3
        if curve:  # a client the broker does not know gets nothing
            stranger = tmp_path / "stranger"
            subprocess.run([*CLI, "keys", stranger, "--client", "viewer"], capture_output=True, timeout=60)
            rogue = _start(["subscribe", "--endpoint", xpub, "--timeout", "3", "--keys", stranger, "--client-name",
                            "viewer"])
            _, rerr = rogue.communicate(timeout=60)
            assert rogue.returncode == 3, rerr
    finally:
        for proc in (pipeline, broker):
            proc.send_signal(2)
        for proc in (pipeline, broker):
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


# -- outages reach the sinks, timestamps stay monotonic ---------------------------------------
def test_reconnect_is_marked_in_the_jsonl_and_the_status_and_pts_keep_increasing(tmp_path: Path) -> None:
    import torch

    from pipeline.run.build import Stages
    from pipeline.run.engine import FrameEngine
    from pipeline.run.runner import Runner
    from pipeline.sinks.jsonl import KeypointWriter
    from pipeline.sources import Source
    from pipeline.sources.demo import SyntheticCamera
    from sapiens2_client.subscriber import ReceiveTimeout, StatusMessage, Subscriber
    from stages.detect import FullFrameDetector

    camera = SyntheticCamera(fps=100.0)
    source = Source(camera.open, label="synthetic", source_id="cam0", live=True, reconnect=True, stall_timeout_s=0.3,
                    open_timeout_s=1.0, backoff_initial_s=0.05, backoff_max_s=0.2)
    kp = tmp_path / "out.jsonl"
    pub = ZmqPublisher("tcp://127.0.0.1:*", status_interval_s=5.0)  # periodic status rare: events must show
    pub.bind()
    sub = Subscriber(pub.endpoint, ["status"])
    assert pub.wait_for_subscriber("status.cam0", 10)
    engine = FrameEngine(Stages(torch.device("cpu"), FullFrameDetector()))
    runner = Runner(source, engine, [KeypointWriter(kp), pub], None, False)
    import threading

    thread = threading.Thread(target=runner.run)
    thread.start()
    healths: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while _lines(kp) < 20:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        camera.stall()
        while "stalled" not in healths or "reconnecting" not in healths:
            assert time.monotonic() < deadline + 30, healths
            try:
                msg = sub.recv(timeout_s=0.5)
            except ReceiveTimeout:
                continue
            if isinstance(msg, StatusMessage):
                healths.append(msg.health)
        camera.resume()
        while "ok" not in healths[healths.index("reconnecting"):]:
            assert time.monotonic() < deadline + 60, healths
            try:
                msg = sub.recv(timeout_s=0.5)
            except ReceiveTimeout:
                continue
            if isinstance(msg, StatusMessage):
                healths.append(msg.health)
        before = _lines(kp)
        while _lines(kp) < before + 10:
            assert time.monotonic() < deadline + 60
            time.sleep(0.02)
    finally:
        runner.stop.set()
        thread.join(30)
        sub.close()
    lines = [json.loads(line) for line in kp.read_text().splitlines()]
    events = [line["event"] for line in lines if "event" in line]
    assert events[:3] == ["stalled", "reconnecting", "resumed"], events
    resumed = next(line for line in lines if line.get("event") == "resumed")
    assert resumed["outage_s"] > 0.2 and resumed["session"] >= 1
    frames = [line for line in lines if "frame" in line]
    pts = [f["pts"] for f in frames]
    assert all(b > a for a, b in zip(pts, pts[1:])), "pts went backwards across the reconnect"
    first_after = frames[next(i for i, f in enumerate(frames) if f["frame"] >= resumed["first_frame"])]
    last_before = frames[next(i for i, f in enumerate(frames) if f["frame"] >= resumed["first_frame"]) - 1]
    gap_s = (first_after["pts"] - last_before["pts"]) / 100  # time base 1/100
    assert gap_s >= 0.2, "the outage does not show in the timestamps"


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _result(i: int) -> FrameResult:
    image = np.zeros((8, 8, 3), np.uint8)
    frame = Frame(i, image, i, Fraction(1, 30), time.time_ns(), "cam0")
    return FrameResult(frame, Detections(np.ones((1, 4), np.float32), [1.0], [0]),
                       Keypoints(np.zeros((1, 308, 2), np.float32), np.zeros((1, 308), np.float32)))


def test_json_header_and_msgpack_header_rogue_fields_never_print_nan() -> None:
    """A header field holding NaN (legal in msgpack) must not reach --json output as NaN."""
    header = msgpack.unpackb(GOOD_STATUS[1])
    header["uptime_s"] = float("nan")  # refused (not finite)
    nan_status = [GOOD_STATUS[0], msgpack.packb(header)]
    header = msgpack.unpackb(GOOD_STATUS[1])
    header["unknown_future_key"] = float("nan")  # ignored (unknown keys are not printed)
    unknown = [GOOD_STATUS[0], msgpack.packb(header)]
    with _subscribed_to_rogue("--topic", "status", "--json", "--count", "2", "--timeout", "30") as (sock, proc):
        _until_joined(sock, proc, unknown)
        sock.send_multipart(nan_status)
        for _ in range(10):
            sock.send_multipart(unknown)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "NaN" not in out and all(json.loads(line) for line in out.splitlines())


# -- hostile values the format has room for, bad flags, honest counts ----------------------------
def _status(**fields) -> list[bytes]:
    return wire.encode("status", "cam0", {"fps": 1.0, "health": "ok", "frames": 1, "last_frame_index": 0,
                                          "drops": {}, **fields}, publish_ns=1)


def _with_header(frames: list[bytes], json_header: bool = False, **fields) -> list[bytes]:
    header = {**wire.load_header(frames[1]), **fields}
    return [frames[0], json.dumps(header).encode() if json_header else msgpack.packb(header, use_bin_type=True)]


@pytest.mark.parametrize("mode", [["--json"], [], ["--save-keypoints", "{tmp}/out.jsonl"]])
def test_status_events_holding_bytes_and_lone_surrogates_never_crash_the_cli(tmp_path: Path, mode: list) -> None:
    good = _status(event={"event": "resumed", "time_ns": 5, "session": 1, "outage_s": 0.5, "first_frame": 3})
    hostile = [_with_header(good, event={"event": "stalled", "time_ns": b"\x01"}),
               _with_header(good, event={"event": "stalled", "detail": [1, b"\x00\xff"]}),
               _with_header(good, event={"event": b"stalled"}),
               _with_header(good, event={"event": "stalled", "detail": msgpack.ExtType(1, b"")}),
               _with_header(good, True, health="\ud800"),
               _with_header(good, True, event={"event": "stalled", "reason": "\udfff"})]
    args = [str(a).format(tmp=tmp_path) for a in mode]
    with _subscribed_to_rogue("--topic", "status", *args, "--count", "3", "--timeout", "30") as (sock, proc):
        if "--save-keypoints" not in mode:  # (that one prints nothing to wait for: the loop below repeats)
            _until_joined(sock, proc, good)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:  # until --count is reached (also a slow join)
            for frames in hostile:
                sock.send_multipart(frames)
            sock.send_multipart(good)
            time.sleep(0.05)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
    if "--json" in mode:
        lines = [json.loads(line) for line in out.splitlines()]
        assert len(lines) == 3 and all(line["event"]["event"] == "resumed" for line in lines)
    if "--save-keypoints" in mode:
        lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert len(lines) == 3 and all(line["event"] == "resumed" for line in lines)
    assert "skipped" in err  # refused, counted, reported


def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder this user cannot create files in (root ignores mode bits: then sysfs, which refuses root)."""
    import tempfile

    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys")):
        try:
            fd, probe = tempfile.mkstemp(dir=candidate)
        except OSError:
            return candidate
        os.close(fd)
        os.unlink(probe)
    pytest.skip("no folder on this machine refuses new files to this user")


BAD_SUBSCRIBE_FLAGS = [
    (["--record", "{tmp}/x.avi"], ".avi"),
    (["--record", "{ro}/x.mp4"], "not writable"),
    (["--record", "{ro}/missing/x.mkv"], "not writable"),
    (["--save-keypoints", "{ro}/x.jsonl"], "not writable"),
    (["--save-keypoints", "{ro}/missing/x.jsonl"], "not writable"),
    (["--save-keypoints", "{tmp}/file.txt/x.jsonl"], "not a folder"),
    (["--endpoint", "tcp://127.0.0.1:99999"], "out of range"),
    (["--endpoint", "127.0.0.1:5699"], "did you mean tcp://127.0.0.1:5699"),
    (["--max-message-mb", "1e13"], "4096"),
    (["--max-message-mb", "1e-7"], "0.01"),
]


@pytest.fixture(scope="module")
def bad_subscribe_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``subscribe`` with each BAD_SUBSCRIBE_FLAGS case through the CLI's main in one interpreter, each in
    a folder of its own: case -> (its run, that folder, the unwritable folder, what that held before)."""
    cases, folders = {}, {}
    for i, (args, _) in enumerate(BAD_SUBSCRIBE_FLAGS):
        tmp = tmp_path_factory.mktemp("bad-subscribe")
        ro = _unwritable_folder(tmp) if any("{ro}" in a for a in args) else tmp
        (tmp / "file.txt").write_text("x")
        folders[i] = (tmp, ro, sorted(p.name for p in ro.iterdir()) if ro.is_dir() else None)
        cases[i] = (["subscribe", *(a.format(tmp=tmp, ro=ro) for a in args), "--timeout", "3"], tmp)
    runs = run_cli_cases(cases, dict(os.environ), timeout=120)
    return {i: (runs[i], *folders[i]) for i in cases}


@pytest.mark.parametrize("case", range(len(BAD_SUBSCRIBE_FLAGS)),
                         ids=[f"{' '.join(args)}-{match}" for args, match in BAD_SUBSCRIBE_FLAGS])
def test_subscribe_refuses_bad_flags_up_front_in_one_line(bad_subscribe_runs: dict, case: int) -> None:
    ran, tmp, ro, before = bad_subscribe_runs[case]
    err, match = ran.stderr, BAD_SUBSCRIBE_FLAGS[case][1]
    assert ran.rc not in (0, 3), err  # 3: it connected and waited
    assert "waiting for messages" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and match in err, err
    assert (sorted(p.name for p in ro.iterdir()) if ro.is_dir() else None) == before  # nothing left behind
    assert not (tmp / "x.avi").exists()


def test_subscribe_accepts_an_output_folder_it_will_create(tmp_path: Path) -> None:
    proc = _start(["subscribe", "--endpoint", f"tcp://127.0.0.1:{_free_port()}", "--save-keypoints",
                   tmp_path / "new" / "deeper" / "out.jsonl", "--timeout", "1"])
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3 and "nothing received" in err, err  # accepted; created only by a first line
    assert not (tmp_path / "new").exists()


def test_timeout_after_only_refused_messages_says_what_arrived(tmp_path: Path) -> None:
    other_version = _with_header(GOOD_STATUS, version=41)
    with _subscribed_to_rogue("--topic", "status", "--timeout", "2") as (sock, proc):
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            sock.send_multipart(other_version)
            time.sleep(0.02)  # pacing, not a wait for a result
        _, err = proc.communicate(timeout=60)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 3, err
    assert "arrived" in last and "version" in last and "another schema version" in last, last
    assert "no pipeline publishes there" not in last


def _keypoints(index: int, source_skipped: int = 0) -> list[bytes]:
    parts = [wire.Part("keypoints", np.zeros((0, 0, 2), np.float32)),
             wire.Part("keypoint_scores", np.zeros((0, 0), np.float32)),
             wire.Part("boxes", np.zeros((0, 4), np.float32)), wire.Part("box_scores", np.zeros(0, np.float32)),
             wire.Part("track_ids", np.zeros(0, np.int64))]
    meta = wire.FrameMeta("cam0", index, capture_ns=1, drops={"source": source_skipped})
    return wire.encode("keypoints", "cam0", wire.meta_fields(meta), parts, publish_ns=1)


def test_missed_counts_real_gaps_not_a_hostile_frame_index_nor_the_sources_skips() -> None:
    with _subscribed_to_rogue("--topic", "", "--timeout", "2") as (sock, proc):
        _until_joined(sock, proc, GOOD_STATUS)
        for index in [0, 2**63 - 1, 0, 2**63 - 1, 0, 2**20 + 10, 0, 1, 2, 5]:  # restarts, then 3 and 4 missed
            sock.send_multipart(_keypoints(index))
        sock.send_multipart(_keypoints(9, source_skipped=3))  # 6-8 never published: the source skipped them
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert [line.split()[1] for line in out.splitlines() if line.startswith("keypoints")][-4:] == ["#1", "#2", "#5",
                                                                                                   "#9"]
    assert "missed 2," in err or err.rstrip().endswith("missed 2"), err


# -- the broker's endpoints and its warnings ------------------------------------------------------
@pytest.mark.parametrize("args, match", [
    (["--xsub", "tcp://127.0.0.1:99999"], "out of range"),
    (["--xsub", "127.0.0.1:5642"], "did you mean tcp://127.0.0.1:5642"),
    (["--xpub", "tcp://127.0.0.1"], "tcp://HOST:PORT"),
    (["--xsub", "tcp://127.0.0.1:5643", "--xpub", "tcp://127.0.0.1:5643"], "both use port 5643"),  # not "in use"
])
def test_broker_refuses_a_bad_endpoint_in_one_line(args: list, match: str) -> None:
    proc = _start(["broker", *args])
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the broker ran with {args}: {out.strip()}")
    assert proc.returncode == 1 and err.startswith("error: ") and match in err, err
    assert len(err.strip().splitlines()) == 1, err


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(2)
    try:
        return proc.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[1]


@pytest.mark.parametrize("curve", [False, True])
def test_broker_warns_when_bound_beyond_loopback_without_curve(tmp_path: Path, curve: bool) -> None:
    keys = tmp_path / "keys"
    if curve:
        assert subprocess.run([*CLI, "keys", keys], capture_output=True, timeout=60).returncode == 0
    broker, xsub, _ = _broker(["--xsub", "tcp://0.0.0.0:0", "--xpub", "tcp://127.0.0.1:0",
                               *(["--curve-dir", keys] if curve else [])])
    err = _stop(broker)
    warned = [line for line in err.splitlines() if line.startswith("WARNING") and "without CURVE" in line]
    if curve:
        assert not warned, err
    else:
        assert len(warned) == 1 and xsub in warned[0], err


@pytest.mark.parametrize("curve", [False, True])
def test_a_publisher_bound_beyond_loopback_without_curve_warns(tmp_path: Path, curve: bool, caplog) -> None:
    keys = tmp_path / "keys"
    if curve:
        assert subprocess.run([*CLI, "keys", keys], capture_output=True, timeout=60).returncode == 0
    pub = ZmqPublisher("tcp://0.0.0.0:*", curve=CurveServerKeys.from_dir(keys) if curve else None)
    with caplog.at_level("WARNING", "pipeline.sinks.publisher"):
        pub.bind()
    pub.close()
    warned = [r.getMessage() for r in caplog.records if "without CURVE" in r.getMessage()]
    if curve:
        assert not warned, caplog.text
    else:
        assert len(warned) == 1 and pub.endpoint in warned[0], caplog.text


def test_broker_logs_a_refused_curve_client_as_a_warning(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    ran = subprocess.run([*CLI, "keys", keys, "--client", "mallory"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    (keys / "authorized" / "mallory.key").unlink()  # the right server key, but not authorised
    broker, _, xpub = _broker(["--xsub", "tcp://127.0.0.1:0", "--xpub", "tcp://127.0.0.1:0", "--curve-dir", keys])
    try:
        sub = _start(["subscribe", "--endpoint", xpub, "--keys", keys, "--client-name", "mallory", "--timeout", "2"])
        _, sub_err = sub.communicate(timeout=60)
    finally:
        err = _stop(broker)
    assert sub.returncode == 3 and "refused" in sub_err.strip().splitlines()[-1], sub_err
    assert "these keys are not authorised there" in sub_err, sub_err
    public = (keys / "clients" / "mallory.key").read_text().split('public-key = "')[1].split('"')[0]
    warned = [line for line in err.splitlines() if line.startswith("WARNING") and "refused" in line]
    assert warned and public in warned[0], err


def test_a_subscriber_with_another_folders_server_key_is_told_so(tmp_path: Path) -> None:
    """Keys made by another `keys` run: the publisher cannot even read the handshake, so it is not
    a refusal of these client keys (which the hint said)."""
    for folder in ("keys", "other"):
        ran = subprocess.run([*CLI, "keys", tmp_path / folder, "--client", "alice"], capture_output=True, text=True,
                             timeout=60)
        assert ran.returncode == 0, ran.stderr
    broker, _, xpub = _broker(["--xsub", "tcp://127.0.0.1:0", "--xpub", "tcp://127.0.0.1:0", "--curve-dir",
                               tmp_path / "keys"])
    try:
        sub = _start(["subscribe", "--endpoint", xpub, "--keys", tmp_path / "other", "--client-name", "alice",
                      "--timeout", "2"])
        _, sub_err = sub.communicate(timeout=60)
    finally:
        _stop(broker)
    last = sub_err.strip().splitlines()[-1]
    assert sub.returncode == 3 and "is not this publisher's" in last and "not authorised" not in last, sub_err


def test_broker_logs_a_client_without_curve_keys_as_a_warning(tmp_path: Path) -> None:
    """A subscriber with no keys at all fails the handshake before any key is checked (the ZAP
    callback never runs): the broker's socket monitor still says so, at warning level."""
    keys = tmp_path / "keys"
    ran = subprocess.run([*CLI, "keys", keys], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    broker, _, xpub = _broker(["--xsub", "tcp://127.0.0.1:0", "--xpub", "tcp://127.0.0.1:0", "--curve-dir", keys])
    try:
        sub = _start(["subscribe", "--endpoint", xpub, "--timeout", "2"])
        sub.communicate(timeout=60)
    finally:
        err = _stop(broker)
    assert sub.returncode == 3
    warned = [line for line in err.splitlines() if line.startswith("WARNING") and "CURVE handshake" in line]
    assert warned and "subscriber" in warned[0], err


def test_publishing_to_a_broker_that_is_not_there_says_so(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """--publish-connect to an endpoint where no broker runs: ZeroMQ retries silently and nothing is
    published, so the pipeline says so once (it logged "publishing ... (connected to a broker)" and
    ran on without a word); when a broker comes, it says that too."""
    import logging

    from pipeline.net.broker import Broker
    from pipeline.sinks import publisher as publisher_module
    from pipeline.sinks import status as status_module

    monkeypatch.setattr(status_module, "BROKER_WAIT_S", 0.5)
    caplog.set_level(logging.INFO, logger=publisher_module.__name__)
    port = _free_port()
    pub = ZmqPublisher(f"tcp://127.0.0.1:{port}", connect=True, status_interval_s=0.2)
    pub.bind()
    def wait_for(text: str, count: int = 1) -> None:
        deadline = time.monotonic() + 60
        while caplog.text.count(text) < count:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)

    try:
        wait_for("no broker answers at")
        with Broker(f"tcp://127.0.0.1:{port}", "tcp://127.0.0.1:*"):
            wait_for("connected to the broker")
        wait_for("lost the broker at")  # the broker stopped: said at once, and again after the wait
        wait_for("no broker answers at", 2)
        with Broker(f"tcp://127.0.0.1:{port}", "tcp://127.0.0.1:*"):
            wait_for("answers again after")
    finally:
        pub.close()
    assert caplog.text.count("no broker answers at") == 2 and "no broker ever answered" not in caplog.text
    never = ZmqPublisher(f"tcp://127.0.0.1:{_free_port()}", connect=True, status_interval_s=0.2)
    never.bind()
    never.close()  # a run that ended before any broker answered: said at the end
    assert f"no broker ever answered at {never.endpoint}" in caplog.text
