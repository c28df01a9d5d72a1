"""``sapiens2-stream batch``: a real archive of PyAV clips (and one truncated file) through the real CLI on
a real local Ray, SIGKILLed once some videos are complete and run again; bad input refused before Ray
starts; the listing of inputs and the completion markers in-process.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.cluster.archive_files import DONE, FAILED, KEYPOINTS, SUMMARY, VIDEO, completed, list_inputs
from stages.errors import ConfigError
from tests.cliutil import (
    CLI,
    OFFLINE,
    assert_one_clear_error,
    assert_person_keypoints,
    decode_video,
    make_video,
    read_jsonl,
    run_cli,
    run_cli_cases,
)
from tests.clusterutil import free_port

CLIPS = {"walk": 6, "jump": 8, "wave": 7, "sit": 10, "run": 9}  # video id -> frames
W, H = 160, 120
BATCH = ["--tasks", "pose", "--workers", "2", *OFFLINE]
DEADLINE_S = 240.0  # Ray start (~10 s), two actors loading models, five clips, on a loaded 2-core machine
RAY_PARTS = ("ray::MapWorker", "raylet", "gcs_server")  # what must be gone after the driver is killed


def _truncated_clip(path: Path) -> Path:
    """An mp4 with its index in front whose second half is missing: it opens, then runs out of frames."""
    make_video(path, 30, W, H, faststart=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    folder = tmp_path / "archive"
    folder.mkdir()
    for name, frames in CLIPS.items():
        make_video(folder / f"{name}.mp4", frames, W, H)
    _truncated_clip(folder / "broken.mp4")
    return folder


@pytest.fixture
def ray_env(cli_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The CLI's offline environment with Ray's files in a folder of their own (short: Ray puts Unix
    sockets in it); the folder not existing afterwards means Ray never started."""
    root = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    env = {**cli_env, "RAY_TMPDIR": str(root)}
    env.pop("RAY_ADDRESS", None)
    try:
        yield env
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- processes of a killed run -----------------------------------------------------------------
def _session(sid: int) -> dict[int, str]:
    """pid -> command line of every live process in session ``sid`` (the CLI and what it started)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            found[int(entry.name)] = cmdline
    return found


def _wait_until(predicate, what: str, deadline_s: float = DEADLINE_S, every_s: float = 0.02) -> None:
    end = time.monotonic() + deadline_s
    while not predicate():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(every_s)


def _kill_session(sid: int) -> None:
    for pid in _session(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _markers(out: Path) -> dict[str, dict]:
    """video id -> its DONE.json, the marker's and the keypoint file's mtimes."""
    found = {}
    for marker in out.glob(f"*/{DONE}"):
        found[marker.parent.name] = {**json.loads(marker.read_text()), "mtime": marker.stat().st_mtime_ns,
                                     "keypoints_mtime": (marker.parent / KEYPOINTS).stat().st_mtime_ns}
    return found


# -- the archive, killed and resumed -----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_batch_killed_then_resumed_does_each_video_once(archive: Path, ray_env: dict[str, str], tiny: Path,
                                                        tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [*CLI, "batch", str(archive), "--out", str(out), *BATCH]
    with open(tmp_path / "first.log", "w") as log_file:
        first = subprocess.Popen(args, env=ray_env, cwd=tmp_path, stdout=log_file, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        def some_done() -> bool:
            assert first.poll() is None, f"the first run ended before the kill:\n{(tmp_path / 'first.log').read_text()}"
            return any(out.glob(f"*/{DONE}"))

        _wait_until(some_done, "the first DONE.json")
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        # The driver is gone; its Ray (head processes and actors) must stop too, or it would race the rerun.
        _wait_until(lambda: not any(part in cmd for cmd in _session(first.pid).values() for part in RAY_PARTS),
                    "the killed run's Ray workers to stop", 120.0, every_s=0.25)  # (a walk of /proc costs CPU)
    finally:
        _kill_session(first.pid)  # what is left of it (Ray's agent processes), by pid
    before = _markers(out)
    assert 1 <= len(before) < len(CLIPS), f"the kill came too late to test resuming: {sorted(before)}"
    first_run = {m["run_id"] for m in before.values()}
    assert len(first_run) == 1
    # What a kill mid-video leaves (whether or not this one did): a partial output in an unfinished folder.
    unfinished = next(name for name in CLIPS if name not in before)
    (out / unfinished).mkdir(exist_ok=True)
    (out / unfinished / f".partial-0-{VIDEO}").write_bytes(os.urandom(1000))
    # And the mark of a worker killed while loading its models (the kill can land then: seen under load).
    (out / ".partial-loading-19990101T000000-dead00-host-1").touch()
    # One complete video's input is replaced (a newer file under the same name): done again, not skipped.
    replaced = sorted(before)[0]
    source = archive / f"{replaced}.mp4"
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 10**9))

    again = run_cli(["batch", archive, "--out", out, *BATCH], ray_env, tmp_path, timeout=DEADLINE_S)
    assert f"done again: {replaced}" in again.stderr, again.stderr
    # The terminal says what ran on random weights (before and after), and explains Ray's error line first.
    assert "batch: RANDOM WEIGHTS (outputs meaningless): tiny random pose model" in again.stderr, again.stderr
    assert f"RANDOM WEIGHTS: {len(CLIPS)} of the videos" in again.stderr, again.stderr
    if "] core_worker.cc:" in again.stderr:
        assert again.stderr.index("max_restarts > 0': expected here") < again.stderr.index("] core_worker.cc:")

    assert again.rc == 1, again.stderr
    last = again.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 of 6 inputs failed: broken ("), again.stderr
    assert "truncated" in last
    summary = {row["video_id"]: row for row in read_jsonl(out / SUMMARY)}
    assert set(summary) == {*CLIPS, "broken"}
    assert summary["broken"]["status"] == "failed" and "truncated" in summary["broken"]["error"]
    assert "broken" in again.stdout and "failed" in again.stdout
    after = _markers(out)
    assert set(after) == set(CLIPS)
    second_run = {m["run_id"] for name, m in after.items() if name not in before}
    assert len(second_run) == 1 and second_run != first_run
    for name, frames in CLIPS.items():
        folder = out / name
        assert sorted(p.name for p in folder.iterdir()) == sorted([DONE, KEYPOINTS, VIDEO]), f"{name}: leftovers"
        marker = after[name]
        assert marker["status"] == "done" and marker["frames"] == frames
        if name in before and name != replaced:  # complete before the kill: skipped, not produced again
            assert summary[name]["status"] == "skipped"
            for key in ("run_id", "mtime", "keypoints_mtime"):
                assert marker[key] == before[name][key], f"{name}: {key} changed, the rerun redid it"
        else:
            assert summary[name]["status"] == "done" and marker["run_id"] in second_run
        assert summary[name]["frames"] == frames
        records = read_jsonl(folder / KEYPOINTS)
        assert [r["frame"] for r in records] == list(range(frames)), name
        for record in records:
            assert_person_keypoints(record)
        video = decode_video(folder / VIDEO)
        assert (video.count, video.width, video.height) == (frames, W, H), name
    assert sorted(p.name for p in (out / "broken").iterdir()) == [FAILED]
    assert [p.name for p in out.rglob(".*")] == [".lock"], "temporary files remain"  # (the run's lock stays)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sigterm_stops_the_batch_as_ctrl_c_does(archive: Path, ray_env: dict[str, str], tiny: Path,
                                                tmp_path: Path) -> None:
    """A scheduler's SIGTERM: the summary of every input is written and printed, one error line, exit 143
    (not Ray's crash report and an abort)."""
    out = tmp_path / "out"
    # One actor: a second would only load the models again (what a SIGTERM does is the driver's, not the actors')
    args = [*CLI, "batch", str(archive), "--out", str(out), "--tasks", "pose", "--workers", "1", *OFFLINE]
    proc = subprocess.Popen(args, env=ray_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait_until(lambda: proc.poll() is not None or any(out.glob(f"*/{DONE}")), "the first DONE.json")
        assert proc.poll() is None, "the run ended before the signal"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        _kill_session(proc.pid)
    assert proc.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1] == "error: terminated", stderr
    assert "Traceback" not in stderr and "SIGTERM received" not in stderr, stderr
    summary = {row["video_id"]: row["status"] for row in read_jsonl(out / SUMMARY)}
    assert set(summary) == {*CLIPS, "broken"} and "done" in summary.values()
    assert set(summary.values()) <= {"done", "unfinished", "failed"}
    assert "video_id" in stdout  # the table


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_on_a_terminal_batch_shows_a_bar_over_the_videos(ray_env: dict[str, str], tiny: Path, tmp_path: Path) -> None:
    """stderr a terminal (a pty that reports no size, as some do: the harder case, where tqdm alone
    draws nothing): one bar over the videos, no per-video lines (those are for logs)."""
    archive = tmp_path / "archive"
    archive.mkdir()
    for name in ("left", "right"):
        make_video(archive / f"{name}.mp4", 4, W, H)
    args = [*CLI, "batch", str(archive), "--out", str(tmp_path / "out"), "--tasks", "pose", "--workers", "1",
            *[a for a in OFFLINE if a != "--no-progress"]]
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(args, env=ray_env, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=secondary, start_new_session=True)
    os.close(secondary)
    shown = bytearray()
    try:
        end = time.monotonic() + DEADLINE_S
        while True:  # until the CLI ended and the terminal has nothing more (Ray's processes may hold it open)
            ready = select.select([primary], [], [], 0.5)[0]
            if ready:
                try:
                    shown += os.read(primary, 65536)
                except OSError:  # every writer closed the terminal
                    break
            elif proc.poll() is not None:
                break
            assert time.monotonic() < end, "the run did not end"
        stdout = proc.stdout.read().decode()
        proc.wait(30)
    finally:
        os.close(primary)
        _kill_session(proc.pid)
    text = shown.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "2/2" in text and "video" in text and "100%|" in text, text  # tqdm: done over total, in videos
    assert "[1/2]" not in text and "[2/2]" not in text, text  # the one-line-per-video form is for logs
    assert "2 inputs: 2 done" in stdout


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_video_that_kills_its_worker_every_time_fails_alone(ray_env: dict[str, str], tiny: Path,
                                                               tmp_path: Path) -> None:
    """Each attempt at the video is SIGKILLed as soon as it starts writing (as a decoder segfault would):
    Ray restarts the actor and retries, and after the last try the video is failed, not the run."""
    archive = tmp_path / "archive"
    archive.mkdir()
    make_video(archive / "poison.mp4", 90, W, H)
    out = tmp_path / "out"
    args = [*CLI, "batch", str(archive), "--out", str(out), "--tasks", "pose", *OFFLINE]
    proc = subprocess.Popen(args, env=ray_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    attempts: set[str] = set()  # each attempt writes its video under a temporary name of its own
    try:
        end = time.monotonic() + DEADLINE_S
        while proc.poll() is None:
            assert time.monotonic() < end, "the run did not end"
            started = {p.name for p in (out / "poison").glob(f".*{VIDEO}")} - attempts
            if started:  # a new attempt is writing: kill the actor (the only one) that runs it
                attempts |= started
                for pid, cmd in _session(proc.pid).items():
                    if "ray::MapWorker" in cmd:
                        os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        stdout, stderr = proc.communicate(30)
    finally:
        _kill_session(proc.pid)
    assert len(attempts) == 3, f"expected the first try and two retries: {sorted(attempts)}"
    assert proc.returncode == 1, stderr
    assert stderr.strip().splitlines()[-1].startswith("error: 1 of 1 inputs failed: poison (its worker process died")
    (row,) = read_jsonl(out / SUMMARY)
    assert row["status"] == "failed" and "died on it 3 times" in row["error"]
    assert sorted(p.name for p in (out / "poison").iterdir()) == [FAILED]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_workers_that_die_while_loading_the_models_end_the_job(ray_env: dict[str, str], tiny: Path,
                                                               tmp_path: Path) -> None:
    """Every worker process is SIGKILLed while it loads its models (as the OOM killer would): Ray would restart
    it forever; the job gives up after a few with one line, instead of hanging."""
    from pipeline.cluster.archive_worker import LOAD_DEATHS, LOADING

    archive = tmp_path / "archive"
    archive.mkdir()
    make_video(archive / "walk.mp4", 5, W, H)
    out = tmp_path / "out"
    proc = subprocess.Popen([*CLI, "batch", str(archive), "--out", str(out), "--tasks", "pose", *OFFLINE],
                            env=ray_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    killed: set[int] = set()
    try:
        end = time.monotonic() + DEADLINE_S
        while proc.poll() is None:
            assert time.monotonic() < end, "the job hung"
            for mark in out.glob(f"{LOADING}*"):  # a worker loading its models: kill it there
                pid = int(mark.name.rsplit("-", 1)[1])
                if pid not in killed:
                    killed.add(pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        _, stderr = proc.communicate(30)
    finally:
        _kill_session(proc.pid)
    assert len(killed) == LOAD_DEATHS
    assert proc.returncode == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: the Ray job stopped after 0 of 1 videos: 3 worker processes died while loading "
                           "the models"), stderr
    assert not list(out.glob(f"{LOADING}*"))
    (row,) = read_jsonl(out / SUMMARY)
    assert row["status"] == "unfinished"


# -- refused before Ray starts -----------------------------------------------------------------
def _manifest(folder: Path, rows: list[tuple[str, str]]) -> Path:
    path = folder / "list.csv"
    path.write_text("video_id,path\n" + "".join(f"{vid},{video}\n" for vid, video in rows))
    return path


BAD = {
    "duplicate ids": (lambda d: [_manifest(d, [("a", "walk.mp4"), ("b", "jump.mp4"), ("a", "wave.mp4")])],
                      "'a' is used twice"),
    "empty folder": (lambda d: [(d / "empty").mkdir() or d / "empty"], "no video files"),
    "glob without matches": (lambda d: [str(d / "*.mkv")], "matches no files"),
    "unreachable address": (lambda d: [d / "walk.mp4", "--address", f"127.0.0.1:{free_port()}"],
                            "no ray cluster answers"),
    "out is a file": (lambda d: [d / "walk.mp4", "--out", d / "walk.mp4"], "--out"),
    "a flag batch sets": (lambda d: [d / "walk.mp4", "--record", d / "x.mp4"], "--record"),
}


@pytest.fixture(scope="module")
def bad_batch_runs(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """``batch`` on every BAD case, through the CLI's main in one interpreter, each in a folder of its own
    with three clips and Ray's files in a folder of its own (which must not exist afterwards): case ->
    (its run, that folder)."""
    env = {k: v for k, v in cli_env.items() if k != "RAY_ADDRESS"}
    cases, ray_tmps = {}, {}
    for case, (build, _) in BAD.items():
        folder = tmp_path_factory.mktemp("bad-batch")
        for name in ("walk", "jump", "wave"):
            make_video(folder / f"{name}.mp4", 3, W, H)
        args = build(folder)
        if "--out" not in args:
            args += ["--out", folder / "out"]
        ray_tmps[case] = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray puts Unix sockets there
        cases[case] = (["batch", *args, *BATCH], folder, {"RAY_TMPDIR": str(ray_tmps[case])})
    try:
        runs = run_cli_cases(cases, env, timeout=180)
        yield {case: (runs[case], ray_tmps[case]) for case in cases}
    finally:
        for folder in ray_tmps.values():
            shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_before_ray(case: str, bad_batch_runs: dict) -> None:
    ran, ray_tmp = bad_batch_runs[case]
    assert_one_clear_error(ran, BAD[case][1])
    assert not (ray_tmp / "ray").exists(), "Ray was started for input it could refuse"


# -- inputs and markers, in-process -------------------------------------------------------------
@pytest.mark.timeout(60)
def test_inputs_from_folders_globs_and_manifests(tmp_path: Path) -> None:
    videos = tmp_path / "videos"
    (videos / "sub").mkdir(parents=True)
    for name in ("b clip.mp4", "a.MOV", "notes.txt", "sub/c.mkv"):
        (videos / name).write_bytes(b"x")
    assert [(i.video_id, Path(i.path).name) for i in list_inputs([str(videos)])] == [("a", "a.MOV"),
                                                                                       ("b_clip", "b clip.mp4")]
    assert [i.video_id for i in list_inputs([str(videos / "**" / "*.mkv")])] == ["c"]
    manifest = _manifest(videos / "sub", [("first", "../a.MOV"), ("", ""), ("second", str(videos / "notes.txt"))])
    items = list_inputs([str(manifest)])
    assert [(i.video_id, i.path) for i in items] == [("first", str((videos / "sub" / "../a.MOV").absolute())),
                                                     ("second", str(videos / "notes.txt"))]
    # the same video named twice (its folder and itself) is done once; two videos of one id are refused
    assert [i.video_id for i in list_inputs([str(videos), str(videos / "a.MOV")])] == ["a", "b_clip"]
    (tmp_path / "a.mp4").write_bytes(b"x")
    with pytest.raises(ConfigError, match="used twice"):
        list_inputs([str(videos), str(tmp_path / "a.mp4")])
    with pytest.raises(ConfigError, match="header must name video_id and path"):
        (videos / "bad.csv").write_text("id,file\nx,a.MOV\n")
        list_inputs([str(videos / "bad.csv")])
    with pytest.raises(ConfigError, match="must be 1-64 characters"):
        list_inputs([str(_manifest(tmp_path, [("../escape", "a.mp4")]))])


@pytest.mark.timeout(60)
def test_a_video_is_complete_only_with_its_marker_and_outputs(tmp_path: Path) -> None:
    folder = tmp_path / "v"
    folder.mkdir()
    assert completed(folder) is None
    (folder / DONE).write_text(json.dumps({"status": "done", "frames": 3}))
    assert completed(folder) is None  # the marker without its outputs
    (folder / KEYPOINTS).write_text("{}\n")
    (folder / VIDEO).write_bytes(b"x")
    assert completed(folder) == {"status": "done", "frames": 3}
    (folder / DONE).write_text('{"status": "do')  # cut short
    assert completed(folder) is None


@pytest.mark.timeout(60)
def test_hidden_files_and_earlier_outputs_are_no_inputs(tmp_path: Path) -> None:
    """A folder's ``._a.mp4`` (macOS) is not a second video 'a'; a recursive glob over a tree that holds
    --out does not take the annotated videos of an earlier run for inputs."""
    tree = tmp_path / "tree"
    (tree / "out" / "a").mkdir(parents=True)
    for name in ("a.mp4", "._a.mp4", "out/a/annotated.mp4"):
        (tree / name).write_bytes(b"x")
    assert [i.video_id for i in list_inputs([str(tree)], out=str(tree / "out"))] == ["a"]
    assert [i.video_id for i in list_inputs([str(tree / "**" / "*.mp4")], out=str(tree / "out"))] == ["a"]
    assert [i.video_id for i in list_inputs([str(tree / "**" / "*.mp4")])] == ["a", "annotated"]  # no --out known


@pytest.mark.timeout(60)
def test_names_an_id_cannot_hold_get_a_short_stable_id_of_their_own(tmp_path: Path) -> None:
    """Non-Latin names (all 'src' before, so they collided) and names over 64 characters: a readable part and
    a hash of the name, the same on every run."""
    folder = tmp_path / "in"
    folder.mkdir()
    long = "a" * 70
    for name in ("日本.mp4", "中文.mp4", f"{long}.mp4", "café.mp4", "plain name.mp4"):
        (folder / name).write_bytes(b"x")
    ids = {Path(i.path).name: i.video_id for i in list_inputs([str(folder)])}
    assert ids["plain name.mp4"] == "plain_name"
    assert ids["日本.mp4"].startswith("video-") and ids["中文.mp4"].startswith("video-")
    assert ids["日本.mp4"] != ids["中文.mp4"]
    assert ids[f"{long}.mp4"].startswith("a" * 55 + "-") and len(ids[f"{long}.mp4"]) <= 64
    assert ids["café.mp4"].startswith("caf-")
    assert ids == {Path(i.path).name: i.video_id for i in list_inputs([str(folder)])}


@pytest.mark.timeout(60)
def test_a_second_run_on_the_same_out_is_refused(tmp_path: Path) -> None:
    from pipeline.cluster.archive_files import lock_out

    with lock_out(tmp_path):
        with pytest.raises(ConfigError, match=r"another batch run \(.* pid \d+\) is using it"):
            lock_out(tmp_path)
    lock_out(tmp_path).close()  # free again once the first has ended


@pytest.mark.timeout(60)
def test_clearing_temporaries_leaves_a_users_own_dotfiles(tmp_path: Path) -> None:
    from pipeline.cluster.archive_files import clear_partials

    for name in (".env", ".gitignore", f".partial-1-{VIDEO}", f"..partial-1-{VIDEO}.finalising.mp4", "notes"):
        (tmp_path / name).write_text("x")
    clear_partials(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".env", ".gitignore", "notes"]


@pytest.mark.timeout(60)
def test_a_marker_is_stale_when_the_weights_changed(tmp_path: Path) -> None:
    """Random weights then real ones, or a checkpoint retrained in place: the weights' fingerprint differs,
    so the video is done again; a marker from before weights were fingerprinted still counts."""
    from pipeline.cluster.archive_files import Item, fingerprint, weights_fingerprint

    video = tmp_path / "a.mp4"
    video.write_bytes(b"x")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"w" * 10)
    item, settings = Item("a", str(video), "test"), {"tasks": ["pose"]}
    before = weights_fingerprint({"pose": ckpt})
    folder = tmp_path / "out" / "a"
    folder.mkdir(parents=True)
    (folder / KEYPOINTS).write_text("{}\n")
    (folder / VIDEO).write_bytes(b"x")
    (folder / DONE).write_text(json.dumps({"status": "done", "fingerprint": fingerprint(item, settings, before)}))
    assert completed(folder, fingerprint(item, settings, before)) is not None
    (ckpt / "model.safetensors").write_bytes(b"w" * 11)  # retrained in place
    assert completed(folder, fingerprint(item, settings, weights_fingerprint({"pose": ckpt}))) is None
    assert completed(folder, fingerprint(item, settings, weights_fingerprint({"pose": tmp_path / "tiny"}))) is None
    (folder / DONE).write_text(json.dumps({"status": "done", "fingerprint": fingerprint(item, settings)}))
    assert completed(folder, fingerprint(item, settings, before)) is not None  # an older marker: no weights key


@pytest.mark.timeout(60)
def test_an_atomic_write_that_fails_leaves_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.cluster import archive_files

    def full(*args) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(archive_files.os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        archive_files.write_atomic(tmp_path / SUMMARY, "row\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
def test_a_marker_that_cannot_be_written_fails_the_video_with_the_reason(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk at DONE.json: that video fails saying so (not "its worker died 3 times"), no marker."""
    from types import SimpleNamespace

    from pipeline.cli.config import RunConfig
    from pipeline.cluster import archive_worker as archive_module
    from pipeline.cluster.archive_files import Item

    def outputs_made(cfg, stages, item, folder, token) -> tuple[int, int]:
        (folder / KEYPOINTS).write_text("{}\n")
        (folder / VIDEO).write_bytes(b"x")
        return 3, 0

    real_write = archive_module.write_atomic

    def write(path: Path, text: str) -> None:
        if path.name == DONE:
            raise OSError(28, "No space left on device")
        real_write(path, text)

    monkeypatch.setattr(archive_module, "_run_one", outputs_made)
    monkeypatch.setattr(archive_module, "write_atomic", write)
    video = tmp_path / "a.mp4"
    video.write_bytes(b"x")
    row = archive_module.process_video(RunConfig(source="-"), SimpleNamespace(random_weights=False),
                                       Item("a", str(video), "test"), tmp_path / "out", "run")
    assert row["status"] == "failed" and "No space left on device" in row["error"]
    assert json.loads((tmp_path / "out" / "a" / FAILED).read_text())["status"] == "failed"
    assert completed(tmp_path / "out" / "a") is None


@pytest.mark.timeout(60)
def test_a_video_done_with_corrupt_packets_says_how_many(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    from types import SimpleNamespace

    from pipeline.cli.config import RunConfig
    from pipeline.cluster import archive_worker as archive_module
    from pipeline.cluster.archive_files import Item, from_marker

    def outputs_made(cfg, stages, item, folder, token) -> tuple[int, int]:
        (folder / KEYPOINTS).write_text("{}\n")
        (folder / VIDEO).write_bytes(b"x")
        return 13, 4  # 13 frames, 4 packets that did not decode

    monkeypatch.setattr(archive_module, "_run_one", outputs_made)
    video = tmp_path / "a.mp4"
    video.write_bytes(b"x")
    item = Item("a", str(video), "test")
    row = archive_module.process_video(RunConfig(source="-"), SimpleNamespace(random_weights=False), item,
                                       tmp_path / "out", "run")
    assert row["status"] == "done" and row["decode_errors"] == 4
    marker = completed(tmp_path / "out" / "a")
    assert marker["decode_errors"] == 4 and from_marker(item, marker, "later")["decode_errors"] == 4
    from pipeline.cluster.archive_report import print_summary

    print_summary([row], tmp_path / SUMMARY)
    assert "4 corrupt packets skipped" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_a_config_file_keeps_its_model_settings_and_loses_its_sources_and_outputs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from pipeline.cli.main import build_parser
    from pipeline.cluster.archive import batch_config

    config = tmp_path / "run.yaml"
    config.write_text("source: webcam\nrecord: out/demo.mp4\nshow: true\ntasks: [pose, seg]\nmax_persons: 3\n")
    args = build_parser().parse_args(["batch", "videos", "--out", str(tmp_path), "--config", str(config),
                                      "--detector", "full-frame"])
    with caplog.at_level("WARNING"):
        cfg = batch_config(args)
    assert (cfg.tasks, cfg.max_persons, cfg.detector) == (["pose", "seg"], 3, "full-frame")
    assert (cfg.source, cfg.record, cfg.show) == ([], None, False)
    assert "ignoring source, record, show" in caplog.text


@pytest.mark.timeout(120)
def test_files_named_relative_to_here_reach_the_workers_absolute(tmp_path: Path, tiny: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers run in other folders (on a cluster, on other hosts): a relative checkpoint or background image
    would be looked for there."""
    from PIL import Image

    from pipeline.cli.main import build_parser
    from pipeline.cluster.archive import batch_config

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny, tmp_path / "ckpt")
    Image.new("RGB", (8, 8)).save(tmp_path / "bg.png")
    args = build_parser().parse_args(["batch", "videos", "--out", "out", "--detector", "full-frame", "--tasks",
                                      "pose,matting", "--checkpoint", "pose=ckpt", "--matte-background", "bg.png"])
    cfg = batch_config(args)
    assert cfg.checkpoints["pose"] == str(tmp_path / "ckpt") and cfg.matte_background == str(tmp_path / "bg.png")
    assert cfg.detector_model == "yolo11n.pt"  # not a file here: a name for Ultralytics, as it is
