"""Each phase of the device benchmark in a worker process, under a deadline (the watchdog).

The parent (``Supervisor``) owns the report. A worker process (spawned: it starts its own CUDA
context) runs the phases it is told to, one at a time, and sends every report line and its
results back over a pipe as they happen, so nothing a phase printed or measured before it hung is
lost. Around each phase the worker arms ``faulthandler.dump_traceback_later(limit, exit=True)``:
a phase that overruns its limit has every thread's traceback written to a dump file and the
worker exits at once (a Python thread cannot be stopped, a process can). The parent copies that
dump into the log (stderr) and the JSON, names the line the main thread hung in, marks the phase
``killed`` and starts a new worker for the next phase (the checkpoints are on disk, so it only
pays the imports, a few seconds).

Backstop: if the worker is still alive ``grace_s`` after the limit (stuck where even the
watchdog's exit cannot end it), the parent sends SIGABRT (faulthandler dumps the threads again)
and, 3 s later, SIGKILL. So a phase ends at most ~15 s after its limit, and the last one at most
~20 s after the end of the budget (device_run.sh leaves 25 s between the budget and its limit).
A phase that fails with a CUDA error ends its worker too (the process's CUDA context is unusable
after one); any other failure only costs that phase.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench.devicekit import BOOKKEEPING, REPO, Ctx, Outcome, Report, call_phase, record_outcome


@dataclass(frozen=True)
class Phase:
    """One phase: its function, the seconds it is expected to take on an H200 (a phase is skipped
    when less of the budget is left) and its watchdog limit (it is ended after that long)."""

    name: str
    fn: Callable[[Ctx], None]
    estimate_s: float
    limit_s: float
    about: str = ""
    smoke_limit_s: float = 150.0  # the CPU smoke run: tiny models on a slow CI machine
    needs_ckpts: bool = True
    hidden: bool = False  # test-only: runs only when named in --phases

    def limit(self, smoke: bool) -> float:
        return min(self.limit_s, self.smoke_limit_s) if self.hidden else (
            self.smoke_limit_s if smoke else self.limit_s)


# -- the worker ----------------------------------------------------------------------------------
class _WorkerReport(Report):
    """The worker's side of the report: every line and every save goes to the parent at once."""

    def __init__(self, conn) -> None:
        super().__init__(Path("."))
        self.results = {}
        self.conn = conn

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.conn.send(("line", line))

    def save(self) -> None:
        # A JSON round trip: plain data only (no tensors through the pipe), and a copy.
        self.conn.send(("results", json.loads(json.dumps(self.results, default=str))))


def _worker_info(device) -> dict[str, Any]:
    import platform

    import torch

    info: dict[str, Any] = dict(python=platform.python_version(), torch=torch.__version__,
                                cuda=torch.version.cuda, cpus=os.cpu_count(), torch_threads=torch.get_num_threads(),
                                main_thread=f"0x{__import__('threading').main_thread().ident:016x}")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device=torch.cuda.get_device_name(device), capability=f"{props.major}.{props.minor}",
                    multiprocessors=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1),
                    cudnn=torch.backends.cudnn.version())
    else:
        cpu = "CPU (smoke run: tiny configs, numbers meaningless)"
        info.update(device=cpu if device.type == "cpu" else str(device))
    return info


def worker_main(conn, config: dict[str, Any]) -> None:
    """Run phases as the parent asks: ("run", name, limit_s, left_s) ... ("exit",)."""
    import faulthandler
    import importlib

    import torch

    phases = {p.name: p for p in importlib.import_module(config["phases_module"]).all_phases()}
    from stages.device import resolve_device

    device = resolve_device(config["device"], make_current=True)  # cuda -> cuda:N (set_device needs the index)
    if device.type == "cuda":
        torch.cuda.init()
    report = _WorkerReport(conn)
    ctx = Ctx(device, config["smoke"], config["iters"], config["seconds"], time.monotonic() + 1e9, report,
              {task: Path(p) for task, p in config["ckpts"].items()})
    state = Path(config["state_dir"])
    dumps = []  # faulthandler needs its files open while armed
    conn.send(("ready", _worker_info(device)))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "exit":
            return
        _, name, limit_s, left_s = message
        dump = open(state / f"{name}.dump", "w")  # noqa: SIM115 - held by faulthandler
        dumps.append(dump)
        faulthandler.enable(file=dump, all_threads=True)  # fatal signals (SIGABRT from the backstop too)
        faulthandler.dump_traceback_later(limit_s, exit=True, file=dump)
        ctx.deadline = time.monotonic() + min(limit_s, left_s)
        try:
            outcome = call_phase(ctx, name, phases[name].fn)
        finally:
            faulthandler.cancel_dump_traceback_later()
        report.save()
        conn.send(("done", outcome.to_dict()))
        if outcome.restart:
            return


# -- the parent ----------------------------------------------------------------------------------
class Interrupted(Exception):
    """The run itself was told to stop (SIGTERM from the outer timeout, Ctrl-C)."""


_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.M)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', re.M)


def hung_where(dump: str, main_thread: str | None) -> str:
    """The innermost frame of the main thread (or of the first thread listed) in a faulthandler
    dump, as ``func (file:line)``."""
    blocks = list(_THREAD.finditer(dump))
    chosen = next((b for b in blocks if b.group(2) == main_thread), blocks[-1] if blocks else None)
    start = chosen.end() if chosen else 0
    frame = _FRAME.search(dump, start)
    if frame is None:
        return "(no Python frame in the dump)"
    path = Path(frame["file"])
    try:
        path = path.resolve().relative_to(REPO)
    except (ValueError, OSError):
        pass
    return f"{frame['func']} ({path}:{frame['line']})"


class Supervisor:
    """Runs phases in worker processes, each under its limit; the report is saved after every event."""

    def __init__(self, report: Report, config: dict[str, Any], smoke: bool, grace_s: float = 10.0,
                 on_ready: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.report, self.config, self.smoke, self.grace_s = report, config, smoke, grace_s
        self.on_ready = on_ready
        self.mp = multiprocessing.get_context("spawn")
        self.proc = None
        self.conn = None
        self.info: dict[str, Any] = {}
        self.workers_started = 0
        self.current: str | None = None
        self.phase_started = time.monotonic()
        self.phase_limit: float | None = None
        Path(config["state_dir"]).mkdir(parents=True, exist_ok=True)

    # events from the worker
    def _handle(self, message: tuple) -> dict[str, Any] | None:
        kind = message[0]
        if kind == "line":
            self.report.lines.append(message[1])
        elif kind == "results":
            self.report.results.update({k: v for k, v in message[1].items() if k not in BOOKKEEPING})
        elif kind == "done":
            return message[1]
        self.report.save()
        return None

    def _start_worker(self, timeout_s: float = 180.0) -> str | None:
        """Start a worker and wait until it is ready; the reason it failed, or None."""
        parent, child = self.mp.Pipe()
        proc = self.mp.Process(target=worker_main, args=(child, self.config), name="device-bench-worker")
        proc.start()
        child.close()
        self.proc, self.conn = proc, parent
        self.workers_started += 1
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if parent.poll(0.2):
                try:
                    message = parent.recv()
                except EOFError:
                    break
                if message[0] == "ready":
                    first = not self.info
                    self.info = message[1]
                    if first and self.on_ready is not None:
                        self.on_ready(self.info)
                    return None
                self._handle(message)
            elif not proc.is_alive():
                break
        self._stop_worker()
        return f"the worker process did not start (exit code {proc.exitcode}; see the log)"

    def _stop_worker(self, kill: bool = False) -> None:
        proc, conn = self.proc, self.conn
        self.proc = self.conn = None
        if proc is None:
            return
        if not kill and proc.is_alive():
            try:
                conn.send(("exit",))
            except (OSError, ValueError):
                pass
            proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        conn.close()

    def close(self) -> None:
        self._stop_worker()

    def run(self, phases: list[Phase], budget_end: float) -> None:
        """Every phase in order: skipped when the budget left is under its estimate (not in the
        smoke run), ended at its limit (or at the end of the budget, whichever is first)."""
        try:
            for phase in phases:
                left = budget_end - time.monotonic()
                if not self.smoke and left < phase.estimate_s:
                    note = f"{max(left, 0):.0f} s of the time budget left, it needs about {phase.estimate_s:.0f} s"
                    record_outcome(self.report, phase.name, Outcome("skipped", note=note), phase.estimate_s,
                                   phase.limit(self.smoke))
                    continue
                self.current, self.phase_limit, self.phase_started = phase.name, None, time.monotonic()
                outcome = self._run_one(phase, budget_end)
                self.current = None
                record_outcome(self.report, phase.name, outcome, phase.estimate_s,
                               None if self.phase_limit is None else round(self.phase_limit, 1))
        except (Interrupted, KeyboardInterrupt) as exc:
            if self.current is not None:
                self._stop_worker(kill=True)
                record_outcome(self.report, self.current, Outcome(
                    "stopped", seconds=round(time.monotonic() - self.phase_started, 1),
                    error=f"the whole run was stopped ({exc or type(exc).__name__}) while this phase ran"), None, None)
            raise
        finally:
            self._stop_worker()

    def _run_one(self, phase: Phase, budget_end: float) -> Outcome:
        if self.proc is None or not self.proc.is_alive():
            self._stop_worker()
            failed = self._start_worker()
            if failed:
                return Outcome("crashed", error=failed)
        assert self.conn is not None and self.proc is not None
        # The limit counts from now (a worker's start is not the phase's), cut at the budget's end.
        left = budget_end - time.monotonic()
        limit = phase.limit(self.smoke) if self.smoke else max(1.0, min(phase.limit(False), left))
        left = limit if self.smoke else left
        self.phase_limit = limit
        dump = Path(self.config["state_dir"]) / f"{phase.name}.dump"
        dump.unlink(missing_ok=True)
        self.conn.send(("run", phase.name, limit, left))
        t0 = self.phase_started = time.monotonic()
        hard = t0 + limit + min(self.grace_s, max(2.0, limit))
        backstop = None
        while True:
            if self.conn.poll(0.2):
                try:
                    message = self.conn.recv()
                except EOFError:
                    break
                done = self._handle(message)
                if done is not None:
                    outcome = Outcome(**done)
                    if outcome.restart:
                        self._stop_worker()
                    return outcome
            elif not self.proc.is_alive():
                break
            elif time.monotonic() > hard:
                backstop = self._backstop()
                break
        self._drain()
        exitcode = self.proc.exitcode
        self._stop_worker(kill=True)
        return self._death(phase, time.monotonic() - t0, limit, exitcode, dump, backstop)

    def _backstop(self) -> str:
        """The worker outlived its limit: SIGABRT (faulthandler dumps the threads), then SIGKILL."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGABRT)
        self.proc.join(3)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
            return "SIGABRT, then SIGKILL"
        return "SIGABRT"

    def _drain(self) -> None:
        """Take the events a dead worker sent before it died."""
        try:
            while self.conn is not None and self.conn.poll(0):
                self._handle(self.conn.recv())
        except (EOFError, OSError):
            pass

    def _death(self, phase: Phase, seconds: float, limit: float, exitcode: int | None, dump_path: Path,
               backstop: str | None) -> Outcome:
        dump = dump_path.read_text(errors="replace") if dump_path.exists() else ""
        where = hung_where(dump, self.info.get("main_thread")) if dump.strip() else None
        if backstop or dump.startswith("Timeout ("):
            how = (f"it did not end at its limit, so the parent sent {backstop}" if backstop
                   else "faulthandler dumped every thread and ended the worker")
            error = f"overran its limit of {limit:.0f} s; {how}"
            error += f"; the main thread was in {where}" if where else ""
            status = "killed"
        else:
            first = next((line for line in dump.splitlines() if line.strip()), "")
            error = f"the worker died (exit code {exitcode})" + (f": {first}" if first else "") + (
                f"; the main thread was in {where}" if where else "")
            status = "crashed"
        print(f"\n=== watchdog: phase {phase.name} {status}: {error}\n=== every thread's traceback "
              f"(faulthandler, most recent call first):\n{dump or '(no dump written)'}=== end of dump\n",
              file=sys.stderr, flush=True)
        return Outcome(status, seconds=round(seconds, 1), error=error, trace=dump or None)


__all__ = ["Interrupted", "Phase", "Supervisor", "hung_where", "worker_main"]
