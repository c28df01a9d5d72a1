"""Helpers for tests that run the ``sapiens2-stream`` CLI as a real subprocess on real files."""

from __future__ import annotations

import contextlib
import json
import math
import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
_SCRIPT = Path(sys.executable).parent / "sapiens2-stream"
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "pipeline.cli.main"]
RUN_TIMEOUT_S = 90.0  # one CLI run, worst case on a slow 2-core machine
NUM_KEYPOINTS = 308
# Flags that make a file run fully offline on tiny random checkpoints with the frame as the person.
OFFLINE = ["--detector", "full-frame", "--fallback-tiny", "--device", "cpu", "--dtype", "float32", "--no-progress"]


# -- helpers ---------------------------------------------------------------------------------
@dataclass
class Ran:
    rc: int
    stdout: str
    stderr: str
    elapsed: float


def run_cli(args: list[str], env: dict[str, str], cwd: Path, timeout: float = RUN_TIMEOUT_S) -> Ran:
    start = time.monotonic()
    proc = subprocess.run([*CLI, *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    return Ran(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def run_cli_on_terminal(args: list[str], env: dict[str, str], cwd: Path, timeout: float = RUN_TIMEOUT_S) -> Ran:
    """``run_cli`` with stderr a terminal (a pty), as a person at a shell has it: ``stderr`` is what it showed."""
    start = time.monotonic()
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([*CLI, *map(str, args)], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=secondary)
    os.close(secondary)
    shown = bytearray()
    try:
        while True:  # until the terminal has nothing more: every writer closed it
            assert time.monotonic() - start < timeout, f"the run did not end:\n{shown.decode(errors='replace')}"
            if select.select([primary], [], [], 0.5)[0]:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                shown += chunk
            elif proc.poll() is not None:
                break
        stdout = proc.stdout.read().decode(errors="replace")
        proc.wait(timeout=30)
    finally:
        os.close(primary)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Ran(proc.returncode, stdout, shown.decode(errors="replace"), time.monotonic() - start)


_CASES = r"""
import json, os, sys, time, traceback
from pipeline.cli.main import main
results = {}
for name, case in json.loads(open(sys.argv[1]).read()).items():
    os.chdir(case["cwd"])
    before = dict(os.environ)
    os.environ.update(case["env"])
    sys.stdout.flush(); sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(case["out"], "wb") as out, open(case["err"], "wb") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        start = time.monotonic()
        try:
            rc = main(case["argv"])
        except SystemExit as exc:  # argparse's exits
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception:  # what a process of its own would die of: rc 1, the traceback on its stderr
            traceback.print_exc()
            rc = 1
        sys.stdout.flush(); sys.stderr.flush()
        results[name] = [rc, time.monotonic() - start]
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
    os.close(saved[0]); os.close(saved[1])
    os.environ.clear()
    os.environ.update(before)
print(json.dumps(results))
"""


def run_cli_cases(cases: dict, env: dict[str, str], timeout: float = 300.0) -> dict:
    """Each case (name -> ``argv``, ``cwd``[, environment variables of its own]) through the CLI's ``main``
    in turn, in one fresh interpreter, each with its own exit code, stdout and stderr (file descriptors 1
    and 2): name -> Ran. For commands refused before any work: an interpreter apiece costs a second of
    start-up per case."""
    with tempfile.TemporaryDirectory(prefix="cli-cases-") as tmp:  # (not in the cases' folders: they are checked)
        folder = Path(tmp)
        spec = {str(i): {"argv": [str(a) for a in case[0]], "cwd": str(case[1]),
                         "env": case[2] if len(case) > 2 else {}, "out": str(folder / f"{i}.out"),
                         "err": str(folder / f"{i}.err")} for i, case in enumerate(cases.values())}
        (folder / "cases.json").write_text(json.dumps(spec))
        proc = subprocess.run([sys.executable, "-c", _CASES, str(folder / "cases.json")], check=False, env=env,
                              cwd=folder, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"the cases' interpreter failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
        results = json.loads(proc.stdout.splitlines()[-1])
        return {name: Ran(results[key][0], Path(spec[key]["out"]).read_text(errors="replace"),
                          Path(spec[key]["err"]).read_text(errors="replace"), results[key][1])
                for key, name in zip(spec, cases)}


def make_video(path: Path, n: int, w: int = 320, h: int = 240, fps: int = 30, faststart: bool = False) -> Path:
    """``n`` frames of a moving bright block on a gradient (so frames differ), libx264 mp4."""
    options = {"movflags": "faststart"} if faststart else {}
    ramp = np.linspace(0, 120, w, dtype=np.float32)[None, :, None]
    base = np.broadcast_to(ramp, (h, w, 3)).astype(np.uint8)
    with av.open(str(path), "w", options=options) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for i in range(n):
            image = base.copy()
            x = (i * 9) % (w - 60)
            image[h // 4: 3 * h // 4, x: x + 60] = (230, 160, 60)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@dataclass
class Decoded:
    count: int
    width: int
    height: int
    times: list[float]  # seconds, presentation order
    pts: list[int]


def decode_video(path: Path) -> Decoded:
    """Every frame of ``path`` decoded with PyAV (raises if the file is not playable)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
    assert frames, f"{path}: no decodable frames"
    return Decoded(len(frames), frames[0].width, frames[0].height,
                   [float(f.pts * f.time_base) for f in frames], [int(f.pts) for f in frames])


def wait_for(condition: Callable[[], Any], what: str, deadline_s: float = 60.0, every_s: float = 0.05):
    """Poll until condition() is truthy (returned); fail naming ``what`` after a generous deadline."""
    end = time.monotonic() + deadline_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(every_s)


def wait_for_log(proc: subprocess.Popen, log: Path, needle: str, deadline_s: float,
                 fails: tuple[str, ...] = ()) -> str:
    """Poll ``proc``'s stderr file ``log`` until it holds ``needle``; its text. Fails at once, with the
    log, when ``proc`` ends first or a line holding one of ``fails`` comes. At the deadline a process
    started with PYTHONFAULTHANDLER=1 is aborted first, so the failure shows where each thread waited."""
    end = time.monotonic() + deadline_s
    while True:
        text = log.read_text()
        if needle in text:
            return text
        said = [line for line in text.splitlines() if any(f in line for f in fails)]
        assert not said, f"{said[0]!r} before {needle!r}; the log:\n{text}"
        assert proc.poll() is None, f"exit {proc.returncode} before {needle!r}; the log:\n{text}"
        if time.monotonic() > end:
            proc.send_signal(signal.SIGABRT)  # faulthandler's dump of every thread, where it is on
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {needle!r}; the log:\n"
                                 f"{log.read_text()[-20000:]}")
        time.sleep(0.1)


@contextlib.contextmanager
def killed_on_exit(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """``proc`` for the block; killed (and reaped) when the block leaves it running, a failure included."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def ctrl_c(proc: subprocess.Popen, timeout: float = 120.0) -> tuple[str, str]:
    """Interrupt ``proc`` as Ctrl-C does (SIGINT) and wait for it: its remaining (stdout, stderr)."""
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=timeout)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def strictly_increasing(values: list) -> bool:
    return all(b > a for a, b in zip(values, values[1:]))


def assert_one_clear_error(ran: Ran, *needles: str) -> str:
    """Non-zero, fast, no traceback, and stderr ends with one ``error:`` line naming the needles."""
    assert ran.rc not in (0, None), f"expected a failure, got rc={ran.rc}\n{ran.stderr}"
    assert ran.elapsed < 120.0, f"took {ran.elapsed:.1f} s to fail"  # not a hang (generous: a loaded machine)
    assert "Traceback" not in ran.stderr, ran.stderr
    lines = [line for line in ran.stderr.splitlines() if line.strip()]
    assert lines, "no message on stderr"
    last = lines[-1]
    assert last.startswith("error:"), f"last stderr line is not an error line: {last!r}\n{ran.stderr}"
    assert sum(line.startswith("error:") for line in lines) == 1, ran.stderr
    for needle in needles:
        assert needle.lower() in last.lower(), f"{needle!r} not in {last!r}"
    return last


def assert_person_keypoints(record: dict) -> None:
    assert record["persons"], f"frame {record['frame']}: no person (full-frame detector gives one)"
    for person in record["persons"]:
        kpts = person["keypoints"]
        assert kpts is not None and len(kpts) == NUM_KEYPOINTS
        assert all(len(k) == 3 for k in kpts)
        assert all(v is not None and math.isfinite(v) for k in kpts for v in k), "non-finite keypoint value"
