"""Durable keypoints end to end: publishers -> broker -> ``sapiens2-stream bridge`` -> Redis Streams -> consumers.

Every component is real: redis-server on loopback, the broker, the pipeline CLI on a generated clip,
the bridge CLI as a subprocess, consumers killed with SIGKILL. Waits are on conditions with generous
deadlines; nothing asserts on time.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from fractions import Fraction
from pathlib import Path

import msgpack
import numpy as np
import pytest
import redis
import zmq

from pipeline.cluster.streams import decode_entry, list_streams
from pipeline.net.broker import Broker
from pipeline.sinks.publisher import ZmqPublisher
from sapiens2_client import wire
from sapiens2_client.keys import CurveClientKeys, CurveServerKeys, make_keys
from sapiens2_client.messages import KeypointsMessage, StatusMessage, decode_message
from stages.types import Detections, Frame, FrameResult, Keypoints, StreamInfo
from tests.cliutil import CLI, OFFLINE, assert_one_clear_error, make_video, read_jsonl, run_cli, run_cli_cases, wait_for
from tests.clusterutil import free_port

NO_RETRY = redis.retry.Retry(redis.backoff.NoBackoff(), 0)  # a test's own client must not wait out an outage
REPO = Path(__file__).resolve().parents[3]
_SUMMARY = re.compile(r"^bridge: stored (\d+), bad (\d+)(?: \((.*)\))?, dropped (\d+), disconnects (\d+)$")


# -- helpers ---------------------------------------------------------------------------------
class BridgeProc:
    """``sapiens2-stream bridge`` as a subprocess; stderr collected by a thread (never a full pipe)."""

    def __init__(self, args: list, env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen([*CLI, "bridge", *map(str, args)], env=env, cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.err: list[str] = []
        self._reader = threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True)
        self._reader.start()
        line = self.proc.stdout.readline()  # "bridge: EP -> URL (...)" once it is connected
        if not line.startswith("bridge:"):
            self.proc.kill()
            self.proc.wait(30)
            self._reader.join(10)
            pytest.fail(f"the bridge did not start: {line!r}\n{''.join(self.err)}")

    def stop(self) -> dict:
        """SIGINT, then the counters of its one-line summary."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            out, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            pytest.fail("the bridge did not stop on SIGINT")
        self._reader.join(10)
        assert self.proc.returncode == 0, "".join(self.err)
        lines = out.strip().splitlines()
        match = _SUMMARY.match(lines[-1]) if lines else None
        assert match, f"no summary line: {out!r}"
        reasons = dict((r.rsplit(" ", 1)[0], int(r.rsplit(" ", 1)[1])) for r in (match[3] or "").split(", ") if r)
        return {"stored": int(match[1]), "bad": int(match[2]), "reasons": reasons, "dropped": int(match[4]),
                "disconnects": int(match[5])}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def result(source: str, i: int) -> FrameResult:
    """A frame result whose keypoints all equal ``i`` (so an entry tells its frame)."""
    frame = Frame(i, np.zeros((16, 16, 3), np.uint8), i, Fraction(1, 30), time.time_ns(), source)
    det = Detections(np.ones((1, 4), np.float32), np.ones(1, np.float32), np.zeros(1, np.int64))
    return FrameResult(frame, det, Keypoints(np.full((1, 308, 2), i, np.float32), np.ones((1, 308), np.float32)))


def publisher(broker: Broker, *sources: str, curve: CurveClientKeys | None = None) -> ZmqPublisher:
    """A pipeline publisher connected to the broker, once the bridge's subscription reached it."""
    pub = ZmqPublisher(broker.xsub_endpoint, connect=True, sndhwm=1000, curve=curve)
    for source in sources:
        pub.open(StreamInfo(source, 16, 16, 30.0, Fraction(1, 30), live=True))
    for source in sources:
        assert pub.wait_for_subscriber(f"keypoints.{source}", 30), "the bridge's subscription never reached us"
    return pub


def keypoint_frames(source: str, i: int, header_format: str = "msgpack") -> list[bytes]:
    """A valid keypoints message of one person, built with the client's encoder."""
    meta = wire.FrameMeta(source_id=source, frame_index=i, capture_ns=time.time_ns(), width=16, height=16)
    parts = [wire.Part("keypoints", np.full((1, 308, 2), i, np.float32)),
             wire.Part("keypoint_scores", np.ones((1, 308), np.float32)),
             wire.Part("boxes", np.ones((1, 4), np.float32)), wire.Part("box_scores", np.ones(1, np.float32)),
             wire.Part("track_ids", np.zeros(1, np.int64))]
    fields = {**wire.meta_fields(meta), "num_persons": 1, "num_keypoints": 308}
    return wire.encode("keypoints", source, fields, parts, publish_ns=time.time_ns(), header_format=header_format)


def entries(client, key: str) -> list[tuple[str, dict]]:
    return [(i.decode(), f) for i, f in client.xrange(key)]


CONSUMER = """
import sys, time
from pipeline.cluster.replay import replay
url, key, group, name, hold_at = sys.argv[1:6]
for n, entry in enumerate(replay(url, key, group, name, count=4, block_ms=200, timeout_s=1.0), 1):
    print(entry.id, entry.message.meta.frame_index, int(entry.redelivered), flush=True)
    if n == int(hold_at):
        print("holding", flush=True)
        time.sleep(600)  # SIGKILLed here: this entry is handled but not acknowledged
"""


def consume(redis_url: str, key: str, hold_at: int, env: dict[str, str]) -> list[tuple[str, int, int]]:
    """Run CONSUMER (group g, consumer c); when hold_at > 0, SIGKILL it while it holds entry number hold_at."""
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER, redis_url, key, "g", "c", str(hold_at)], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stdout:
            if line.strip() == "holding":
                proc.kill()
                break
            entry_id, frame_index, redelivered = line.split()
            seen.append((entry_id, int(frame_index), int(redelivered)))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == (-signal.SIGKILL if hold_at else 0), err
    return seen


# -- (a) a pipeline run lands in its source's stream --------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_pipeline_run_is_stored_one_entry_per_keypoint_message(cli_env: dict[str, str], tmp_path: Path,
                                                               redis_url: str) -> None:
    clip = make_video(tmp_path / "clip.mp4", n=6)
    client = redis.Redis.from_url(redis_url)
    with Broker("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as broker:
        bridge = BridgeProc(["--endpoint", broker.xpub_endpoint, "--redis", redis_url, "--topic", "keypoints",
                             "--topic", "status"], cli_env, tmp_path)
        try:
            publisher(broker, "probe").close()  # the broker holds the bridge's subscription: the pipeline gets it
            ran = run_cli(["--source", clip, "--tasks", "pose", *OFFLINE, "--source-id", "cam1", "--publish-connect",
                           broker.xsub_endpoint, "--save-keypoints", tmp_path / "kp.jsonl"], cli_env, tmp_path)
            assert ran.rc == 0, ran.stderr
            records = read_jsonl(tmp_path / "kp.jsonl")
            assert len(records) == 6
            key, status_key = "sapiens2:keypoints:cam1", "sapiens2:status:cam1"
            wait_for(lambda: client.xlen(key) >= len(records), f"{len(records)} entries in {key}")
            wait_for(lambda: any(f[b"health"] == b"closed" for _, f in entries(client, status_key)), "the last status")
        finally:
            summary = bridge.stop()
    stored, statuses = entries(client, key), entries(client, status_key)
    assert len(stored) == len(records) and summary["bad"] == 0
    assert summary["stored"] == len(records) + len(statuses) + client.xlen("sapiens2:status:probe")
    assert list_streams(client) == [key] and status_key in list_streams(client, kind="status")
    last = decode_entry(statuses[-1][1])
    assert isinstance(last, StatusMessage) and last.health == "closed" and last.last_frame_index == records[-1]["frame"]
    for (_, fields), record in zip(stored, records):
        msg = decode_entry(fields)  # our helper ...
        plain = decode_message(msgpack.unpackb(fields[b"wire"]))  # ... and the documented way, client package only
        for m in (msg, plain):
            assert isinstance(m, KeypointsMessage) and m.meta.source_id == "cam1" and m.meta.random_weights
            assert m.meta.frame_index == record["frame"] and m.meta.capture_ns == record["capture_ns"]
        expected = np.array([p["keypoints"] for p in record["persons"]], np.float32)  # (N, K, 3): x, y, score
        np.testing.assert_allclose(msg.keypoints, expected[..., :2], atol=1e-3)  # JSONL rounds to 3 digits
        np.testing.assert_allclose(msg.keypoint_scores, expected[..., 2], atol=1e-3)
        assert fields[b"source"] == b"cam1" and fields[b"kind"] == b"keypoints"
        assert int(fields[b"frame_index"]) == record["frame"] and int(fields[b"capture_ns"]) == record["capture_ns"]
        assert int(fields[b"persons"]) == len(record["persons"]) == 1


# -- (b) a consumer killed mid-way continues where it stopped -------------------------------------
@pytest.mark.timeout(180)
def test_consumer_killed_mid_way_continues_without_loss(cli_env: dict[str, str], tmp_path: Path,
                                                        redis_url: str) -> None:
    n, hold_at, key = 30, 7, "sapiens2:keypoints:cam2"
    client = redis.Redis.from_url(redis_url)
    with Broker("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as broker:
        bridge = BridgeProc(["--endpoint", broker.xpub_endpoint, "--redis", redis_url], cli_env, tmp_path)
        try:
            pub = publisher(broker, "cam2")
            for i in range(n):
                pub.write(result("cam2", i))
            wait_for(lambda: client.xlen(key) >= n, f"{n} entries in {key}")
            pub.close()
        finally:
            bridge.stop()
    ids = [i for i, _ in entries(client, key)]
    assert len(ids) == n

    first = consume(redis_url, key, hold_at, cli_env)
    assert [e[0] for e in first] == ids[:hold_at]  # the last of these was handled but never acknowledged
    pending = client.xpending(key, "g")["pending"]
    assert pending >= 1  # the held entry, and the rest of the batch read with it

    second = consume(redis_url, key, 0, cli_env)
    assert [e[0] for e in second] == ids[hold_at - 1:]  # pending first, then new; nothing acked comes again
    assert [e[2] for e in second[:pending]] == [1] * pending and not any(e[2] for e in second[pending:])
    assert {e[0] for e in first} | {e[0] for e in second} == set(ids)
    assert sorted({e[1] for e in first + second}) == list(range(n))
    assert client.xpending(key, "g")["pending"] == 0


# -- (c) MAXLEN keeps the stream bounded (behind a CURVE broker, the bridge its client) -------------
@pytest.mark.timeout(180)
def test_maxlen_keeps_each_stream_bounded_behind_a_curve_broker(cli_env: dict[str, str], tmp_path: Path,
                                                                redis_url: str) -> None:
    n, maxlen, key = 400, 50, "sapiens2:keypoints:cam3"
    keys = tmp_path / "keys"
    make_keys(keys, ["pipeline", "bridge"])
    client = redis.Redis.from_url(redis_url)
    node = int(client.config_get("stream-node-max-entries")["stream-node-max-entries"])

    def last_index() -> int:
        newest = client.xrevrange(key, count=1)
        return int(newest[0][1][b"frame_index"]) if newest else -1

    with Broker("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", curve=CurveServerKeys.from_dir(keys)) as broker:
        bridge = BridgeProc(["--endpoint", broker.xpub_endpoint, "--redis", redis_url, "--maxlen", maxlen,
                             "--keys", keys, "--client-name", "bridge"], cli_env, tmp_path)
        try:
            pub = publisher(broker, "cam3", curve=CurveClientKeys.from_dir(keys, "pipeline"))
            for i in range(n):
                pub.write(result("cam3", i))
                if i % 50 == 49:  # bounded in flight: no queue along the way can overflow
                    wait_for(lambda: last_index() == i, f"entry {i}")
                    assert maxlen <= client.xlen(key) <= maxlen + node
            pub.close()
        finally:
            summary = bridge.stop()
    assert summary["stored"] == n and summary["dropped"] == 0
    assert client.xinfo_stream(key)["entries-added"] == n
    kept = entries(client, key)
    assert maxlen <= len(kept) <= maxlen + node < n  # approximate: whole nodes go, never below maxlen
    assert [int(f[b"frame_index"]) for _, f in kept] == list(range(n - len(kept), n))  # the newest stay


# -- (d) hostile input is counted and skipped ---------------------------------------------------
def _garbage() -> list[tuple[str, list[bytes]]]:
    """(reason, frames) of messages that the decoder must refuse, in the bridge's counted reasons."""
    good = keypoint_frames("cam4", 0, header_format="json")
    header = json.loads(good[1])

    def with_header(**changes) -> list[bytes]:
        return [good[0], json.dumps({**header, **changes}).encode(), *good[2:]]

    return [
        ("frames", [b"keypoints.cam4"]),
        ("header", [b"keypoints.cam4", b"\xc1\xc1 not msgpack"]),
        ("schema", with_header(schema="something.else")),
        ("version", with_header(version=99)),
        ("topic", with_header(source_id="cam5")),
        ("field", with_header(frame_index=-1)),
        ("shape", [*good[:2], good[2][:-4], *good[3:]]),
        ("dtype", with_header(parts=[{**header["parts"][0], "dtype": "|O"}, *header["parts"][1:]])),
        ("parts", [*good[:2], *good[2:-1]]),
        ("frames", [b"keypoints.cam4", good[1], *[b""] * 40]),
        ("sources", keypoint_frames("cam6", 0)),  # a third source over --max-sources 2
    ]


@pytest.mark.timeout(180)
def test_hostile_messages_are_counted_and_skipped(cli_env: dict[str, str], tmp_path: Path, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    ctx = zmq.Context()
    with Broker("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as broker:
        bridge = BridgeProc(["--endpoint", broker.xpub_endpoint, "--redis", redis_url, "--max-message-mb", 1,
                             "--max-sources", 2], cli_env, tmp_path)
        raw = ctx.socket(zmq.XPUB)  # a hand-made publisher: it sends whatever it likes
        raw.setsockopt(zmq.LINGER, 0)
        try:
            raw.connect(broker.xsub_endpoint)
            raw.setsockopt(zmq.RCVTIMEO, 30_000)
            assert raw.recv() == b"\x01keypoints.", "the bridge's subscription did not reach the publisher"

            def stored(source: str, i: int) -> bool:
                return any(int(f[b"frame_index"]) == i for _, f in entries(client, f"sapiens2:keypoints:{source}"))

            for source in ("cam4", "cam5"):
                raw.send_multipart(keypoint_frames(source, 0))
            wait_for(lambda: stored("cam4", 0) and stored("cam5", 0), "the first valid messages")
            garbage = _garbage()
            for _, frames in garbage:
                raw.send_multipart(frames)
            raw.send_multipart(keypoint_frames("cam4", 1))  # after the garbage, on the same connection
            wait_for(lambda: stored("cam4", 1), "the valid message after the garbage")
            raw.send_multipart(keypoint_frames("cam4", 2)[:2] + [b"\0" * (2 * 2**20)])  # over the socket's limit
            probe = iter(range(3, 10_000))

            def probe_stored() -> bool:  # the bridge connects again and stores what follows
                raw.send_multipart(keypoint_frames("cam4", next(probe)))
                return len(entries(client, "sapiens2:keypoints:cam4")) >= 3

            wait_for(probe_stored, "a valid message after the oversized one", every_s=0.2)
            assert bridge.proc.poll() is None, "".join(bridge.err)
        finally:
            raw.close()
            ctx.term()
            summary = bridge.stop()
    expected: dict[str, int] = {}
    for reason, _ in garbage:
        expected[reason] = expected.get(reason, 0) + 1
    assert summary["reasons"] == expected and summary["bad"] == len(garbage)
    assert summary["disconnects"] >= 1 and summary["dropped"] == 0
    assert list_streams(client) == ["sapiens2:keypoints:cam4", "sapiens2:keypoints:cam5"]
    for key in list_streams(client):
        for _, fields in entries(client, key):
            assert isinstance(decode_entry(fields), KeypointsMessage)  # only valid messages were stored
    assert sum("skipping a message" in line for line in bridge.err) == len(expected)  # one warning per reason


# -- Redis going away: the bridge counts what it drops and carries on ----------------------------
@pytest.mark.timeout(180)
def test_redis_restart_is_survived_and_drops_are_counted(cli_env: dict[str, str], tmp_path: Path,
                                                         redis_url: str) -> None:
    port, key = urllib.parse.urlsplit(redis_url).port, "sapiens2:keypoints:cam7"
    published = 0
    again = None
    with Broker("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as broker:
        bridge = BridgeProc(["--endpoint", broker.xpub_endpoint, "--redis", redis_url], cli_env, tmp_path)
        pub = publisher(broker, "cam7")

        def send() -> None:
            nonlocal published
            pub.write(result("cam7", published))
            published += 1

        try:
            client = redis.Redis.from_url(redis_url, retry=NO_RETRY)
            for _ in range(3):
                send()
            wait_for(lambda: client.xlen(key) == 3, "the first entries")
            try:
                client.shutdown(nosave=True)
            except redis.ConnectionError:
                pass  # the server went away while answering
            send()
            wait_for(lambda: any("does not answer" in line for line in bridge.err), "the bridge to notice")
            (tmp_path / "again").mkdir()
            again = subprocess.Popen([shutil.which("redis-server"), "--bind", "127.0.0.1", "--port", str(port),
                                      "--save", "", "--appendonly", "no", "--dir", str(tmp_path / "again")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            fresh = redis.Redis.from_url(redis_url, retry=NO_RETRY)

            def stored_again() -> bool:
                send()
                try:
                    return fresh.xlen(key) > 0
                except redis.ConnectionError:
                    return False  # still starting

            wait_for(stored_again, "an entry in the restarted Redis", every_s=0.2)
            last = published
            send()  # the marker: once it is stored, every message before it has been handled
            wait_for(lambda: any(int(f[b"frame_index"]) == last for _, f in entries(fresh, key)), "the marker")
            assert pub.stats.dropped.total() == 0
            assert bridge.proc.poll() is None, "".join(bridge.err)
        finally:
            pub.close()
            summary = bridge.stop()
            if again is not None:
                again.terminate()
                again.wait(30)
    assert summary["dropped"] >= 1 and summary["stored"] + summary["dropped"] == published
    assert any("answers again" in line and "dropped meanwhile" in line for line in bridge.err), "".join(bridge.err)


# -- (e) bad input: one line, non-zero, before subscribing ----------------------------------------
BAD_BRIDGE_ARGS = [
    (["--redis", "redis://user:hunter2@127.0.0.1:{port}/0"], ["does not answer", "127.0.0.1:{port}"]),
    (["--redis", "redis://127.0.0.1:notaport/0"], ["bad Redis URL", "notaport", "redis://HOST:PORT/DB"]),
    (["--endpoint", "tcp://127.0.0.1", "--redis", "redis://127.0.0.1:{port}/0"], ["tcp://HOST:PORT"]),
]


@pytest.fixture(scope="module")
def bad_bridge_runs(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    """``bridge`` with each BAD_BRIDGE_ARGS case through the CLI's main in one interpreter; the port at
    which nothing listens."""
    port = str(free_port())
    cases = {i: (["bridge", *(a.replace("{port}", port) for a in args)], tmp_path_factory.mktemp("bad-bridge"))
             for i, (args, _) in enumerate(BAD_BRIDGE_ARGS)}
    return run_cli_cases(cases, cli_env, timeout=120), port


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", range(len(BAD_BRIDGE_ARGS)))
def test_bad_input_is_one_clear_line(bad_bridge_runs: tuple[dict, str], case: int) -> None:
    runs, port = bad_bridge_runs
    ran = runs[case]
    assert_one_clear_error(ran, *(n.replace("{port}", port) for n in BAD_BRIDGE_ARGS[case][1]))
    assert "hunter2" not in ran.stderr + ran.stdout and ran.stdout == ""  # no password, no start-up line
