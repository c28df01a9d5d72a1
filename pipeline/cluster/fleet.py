"""Live camera fleets on Ray Core: the actors behind ``sapiens2-stream fleet`` (commands: fleet_cli.py).

Two actors, both named (namespace ``sapiens2-stream``) and restarted by Ray without limit:

- ``GpuWorker`` (fleet_worker.py; ``num_gpus=1``, one per GPU): the batched multi-source pipeline of
  one process, its publisher connected to the broker's XSUB side; frames never touch Ray's object store.
- ``FleetController`` (detached, on the head node): owns the camera-to-worker placement, mirrors it to
  Redis (best effort, mirror.py) and watches the workers from a thread of its own (a report every half
  second, and Ray's node table). A lost worker's cameras go at once to the survivors with spare
  capacity; each camera's outage (from the loss to its first frame on the new worker) is kept in the
  status and published as a status message. A restarted controller reads the placement back from
  Redis and finds its workers by name. See docs/DEPLOYMENT.md, "Live fleets".
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .fleet_worker import GpuWorker, node_id
from .fleetspec import Camera, FleetSpec, place
from .mirror import Mirror
from .prerequisites import need

log = logging.getLogger(__name__)
NAMESPACE = "sapiens2-stream"
HEAD_RESOURCE = "node:__internal_head__"  # Ray's own resource of the head node (where the controller runs)
REPORT_EVERY_S = 0.5
_OUTAGES_KEPT = 200


def controller_name(fleet: str) -> str:
    return f"{fleet}-controller"


def worker_name(fleet: str, index: int) -> str:
    return f"{fleet}-gpu-{index}"


def redis_keys(fleet: str) -> dict[str, str]:
    base = f"sapiens2:fleet:{fleet}"
    return {"spec": f"{base}:spec", "cameras": f"{base}:cameras", "placement": f"{base}:placement",
            "outages": f"{base}:outages", "starts": f"{base}:controller_starts"}


# -- the controller --------------------------------------------------------------------------
@dataclass
class _Worker:
    index: int
    handle: Any
    alive: bool = False
    node: str | None = None
    report_ref: Any = None
    sent_at: float = 0.0
    last_ok: float = 0.0
    last_ok_wall: float | None = None  # time.time() of the last report: the outage is counted from there
    running: dict[str, dict] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    lost_at: float | None = None


@dataclass
class _CameraState:
    status: str = "pending"  # pending | starting | running | retrying | moving | waiting (no capacity)
    error: str | None = None
    attempts: int = 0
    next_try: float = 0.0
    add_ref: Any = None
    frames: int = 0
    down_since: float | None = None  # wall clock (time.time) of the last report before the loss
    down_reason: str | None = None
    from_worker: int | None = None
    outage_total_s: float = 0.0
    last_outage_s: float | None = None
    health: str = "ok"  # the source's own, while it runs: ok, stalled, reconnecting


class FleetController:
    """See the module docstring. All state changes happen on the controller's own thread, one loop
    step at a time; the methods called by the CLI hand their change to that thread and wait."""

    def __init__(self, redis_url: str, fleet: str) -> None:
        redis = need("redis", "fleet")
        self.fleet, self.keys = fleet, redis_keys(fleet)
        self.db = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=3)
        delay = 0.5
        while True:  # a restart while Redis is away waits for it (a constructor that raised would stay dead)
            try:
                self._read_state()
                break
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                log.warning("fleet %s: Redis does not answer (%s); the controller waits for it", fleet, exc)
                time.sleep(delay)
                delay = min(2 * delay, 5.0)
        self.mirror = Mirror(self.db, fleet, self.keys)
        self.state = {cid: _CameraState() for cid in self.cameras}
        self.workers: dict[int, _Worker] = {}
        self._lock = threading.Lock()
        self._publisher = None
        self._stop = threading.Event()
        if self.spec is not None:
            self._start_workers()
            self._connect_publisher()
        self._thread = threading.Thread(target=self._run, name="fleet-controller", daemon=True)
        self._thread.start()
        log.info("fleet %s controller start %d: %d cameras, %d placed (from Redis)", fleet, self.starts,
                 len(self.cameras), len(self.placement))

    def _read_state(self) -> None:
        """Settings, cameras, placement and outages as Redis has them (empty for a new fleet)."""
        self.starts = int(self.db.incr(self.keys["starts"]))
        raw = self.db.get(self.keys["spec"])
        self.spec: FleetSpec | None = FleetSpec.from_dict(json.loads(raw)) if raw else None
        stored = self.db.hgetall(self.keys["cameras"])
        self.cameras = {cid.decode(): Camera(**json.loads(v)) for cid, v in stored.items()}
        self.placement = {cid.decode(): int(v) for cid, v in self.db.hgetall(self.keys["placement"]).items()}
        self.outages = [json.loads(o) for o in self.db.lrange(self.keys["outages"], 0, _OUTAGES_KEPT - 1)]

    # -- calls from the CLI (repeat-safe) ---------------------------------------------------
    def configure(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Apply a fleet file: settings, and its cameras added or updated (others are kept)."""
        new = FleetSpec.from_dict(spec)
        if self._stop.is_set():
            return self._taken_down()
        with self._lock:
            old = self.spec
            if old is not None and self.workers and (old.pipeline, old.broker, old.gpus) != (new.pipeline, new.broker,
                                                                                             new.gpus):
                return {"ok": False, "error": "this fleet runs with other pipeline, broker or gpus settings; "
                                              "`sapiens2-stream fleet down` it first, or give it another name"}
            self.spec = new
            self.mirror.write(lambda pipe: pipe.set(self.keys["spec"], json.dumps({**new.to_dict(), "cameras": []})))
            self._start_workers()
            self._connect_publisher()
        refused = [r["error"] for r in (self.add(camera.to_dict()) for camera in new.cameras) if not r.get("ok")]
        if refused:  # the rest is applied; the file asks for what the fleet does not do (a changed camera)
            return {"ok": False, "error": f"{len(refused)} camera(s) not applied: {'; '.join(refused)}"}
        return {"ok": True, "workers": len(self.workers)}

    def add(self, camera: dict[str, Any]) -> dict[str, Any]:
        cam = Camera(**camera)
        if self._stop.is_set():
            return self._taken_down()
        with self._lock:
            old = self.cameras.get(cam.id)
            if old == cam:
                return {"ok": True, "id": cam.id, "already": True}
            if old is not None:
                return {"ok": False, "error": f"camera {cam.id!r} is in the fleet with uri {old.uri!r}; remove it "
                                              "first to change it"}
            self.cameras[cam.id] = cam
            self.state[cam.id] = _CameraState()
            self.mirror.write(lambda pipe: pipe.hset(self.keys["cameras"], cam.id, json.dumps(cam.to_dict())))
        return {"ok": True, "id": cam.id}

    def remove(self, camera_id: str) -> dict[str, Any]:
        with self._lock:
            if camera_id not in self.cameras:
                return {"ok": True, "id": camera_id, "absent": True}
            del self.cameras[camera_id]
            self.state.pop(camera_id, None)
            index = self.placement.pop(camera_id, None)
            self.mirror.write(lambda pipe: (pipe.hdel(self.keys["cameras"], camera_id),
                                            pipe.hdel(self.keys["placement"], camera_id)))
            worker = self.workers.get(index) if index is not None else None
        if worker is not None and worker.alive:
            worker.handle.remove.remote(camera_id)
        return {"ok": True, "id": camera_id}

    def status(self) -> dict[str, Any]:
        with self._lock:
            workers = [{"index": w.index, "node": w.node, "alive": w.alive,
                        "state": "alive" if w.alive else ("LOST" if w.lost_at is not None else "starting"),
                        "cameras": sorted(c for c, i in self.placement.items() if i == w.index),
                        "running": sorted(w.running)} for w in self.workers.values()]
            cameras = []
            for cid, cam in sorted(self.cameras.items()):
                st = self.state.get(cid, _CameraState())
                status = st.health if st.status == "running" and st.health in ("stalled", "reconnecting") else st.status
                cameras.append({"id": cid, "uri": cam.uri, "worker": self.placement.get(cid), "status": status,
                                "frames": st.frames, "error": st.error, "attempts": st.attempts,
                                "outage_total_s": round(st.outage_total_s, 3),
                                "last_outage_s": None if st.last_outage_s is None else round(st.last_outage_s, 3)})
            outages = self.outages[:50]
        self.mirror.check()  # here and in its watch, not in the loop: a hanging Redis delays this answer, no failover
        return {"fleet": self.fleet, "controller_starts": self.starts, "controller_node": node_id(),
                "redis_ok": not self.mirror.behind,
                "capacity": self.spec.capacity if self.spec else None, "workers": workers, "cameras": cameras,
                "outages": outages}

    def _taken_down(self) -> dict[str, Any]:
        return {"ok": False, "error": "this fleet was taken down, but its Redis keys remain (Redis did not answer); "
                                      "run `sapiens2-stream fleet down` again once Redis answers"}

    def down(self) -> dict[str, Any]:
        """Stop every worker and forget the fleet (Redis keys deleted); the controller is killed by the CLI."""
        import ray

        self._stop.set()
        self.mirror.close()
        with self._lock:
            for worker in self.workers.values():
                try:
                    ray.kill(worker.handle, no_restart=True)
                except Exception:  # already gone
                    log.debug("killing worker %d", worker.index, exc_info=True)
            self.workers.clear()  # (status says so; an `up` now is refused until a `down` finishes)
            try:
                self.db.delete(*self.keys.values())
            except Exception as exc:  # Redis away: a later `fleet up` of this name would bring the cameras back
                return {"ok": False, "error": f"the GPU actors are stopped, but Redis does not answer "
                                              f"({type(exc).__name__}) and the fleet's keys remain; start Redis and "
                                              "run `fleet down` again"}
        return {"ok": True}

    # -- the controller's loop ------------------------------------------------------------------
    def _start_workers(self) -> None:
        """Create the GPU actors (or find them by name after a controller restart)."""
        import ray

        assert self.spec is not None
        count = self.spec.gpus or max(1, int(ray.cluster_resources().get("GPU", 0)))
        actor = ray.remote(GpuWorker)
        for index in range(count):
            if index in self.workers:
                continue
            handle = actor.options(name=worker_name(self.fleet, index), namespace=NAMESPACE, lifetime="detached",
                                   get_if_exists=True, max_restarts=-1, max_task_retries=0,
                                   num_gpus=self.spec.gpus_per_actor, num_cpus=0, max_concurrency=16
                                   ).remote(index, self.spec.to_dict())
            self.workers[index] = _Worker(index, handle)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    self._step()
            except Exception:  # the loop must outlive any one failure (Redis blip, a dying actor)
                log.exception("fleet controller step failed; going on")
            self._stop.wait(0.1)

    def _step(self) -> None:
        import ray

        now = time.monotonic()
        for worker in self.workers.values():
            if worker.report_ref is None:
                worker.report_ref, worker.sent_at = worker.handle.report.remote(), now
        refs = [w.report_ref for w in self.workers.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=REPORT_EVERY_S) if refs else ([], [])
        alive_nodes = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        for worker in self.workers.values():
            if worker.report_ref in ready:
                ref, worker.report_ref = worker.report_ref, None
                try:
                    report = ray.get(ref)
                except Exception as exc:  # RayActorError, ActorUnavailableError, a dead pipeline
                    self._lost(worker, f"GPU actor {worker.index} failed ({type(exc).__name__})")
                    if "stopped" in str(exc):
                        ray.kill(worker.handle, no_restart=False)  # let Ray restart a dead pipeline
                    continue
                self._alive(worker, report)
            elif worker.alive and worker.node is not None and worker.node not in alive_nodes:
                self._lost(worker, f"node {worker.node[:12]} of GPU actor {worker.index} is gone")
                worker.report_ref = None
            elif now - worker.sent_at > self.spec.liveness_s and (worker.alive or self._has_cameras(worker)):
                # (never answered since a controller restart, yet holds cameras: Ray may be restarting it
                # and waiting for a free GPU; its cameras must not wait with it)
                self._lost(worker, f"GPU actor {worker.index} did not answer for {self.spec.liveness_s:.0f} s")
                worker.report_ref = None
        self._finish_adds()
        self._place_and_start(now)
        self.mirror.catch_up(self)

    def _has_cameras(self, worker: _Worker) -> bool:
        return any(index == worker.index for index in self.placement.values())

    def _alive(self, worker: _Worker, report: dict[str, Any]) -> None:
        worker.alive, worker.node, worker.last_ok, worker.lost_at = True, report["node"], time.monotonic(), None
        worker.last_ok_wall = time.time()
        worker.running = {s["id"]: s for s in report["sources"]}
        worker.failed = report["failed"]
        for cid, desc in worker.running.items():
            if self.placement.get(cid) != worker.index:
                worker.handle.remove.remote(cid)  # moved or removed while this worker was away
                continue
            st = self.state[cid]
            st.frames = int(desc.get("frames") or 0)
            st.health = str(desc.get("health") or "ok")
            if st.status != "running":
                st.status = "running" if st.frames > 0 else "starting"
            if st.status == "running" and st.down_since is not None:
                self._resumed(cid, st, worker.index)
            if st.status == "running":
                st.error, st.attempts = None, 0
        for cid, index in list(self.placement.items()):
            st = self.state.get(cid)
            if index != worker.index or st is None or cid in worker.running or st.add_ref is not None:
                continue
            if st.status in ("running", "starting"):  # it ended or failed on the worker: try again later
                why = worker.failed.get(cid) or "the source ended"
                self._retry_later(cid, st, why)

    def _lost(self, worker: _Worker, why: str) -> None:
        if not worker.alive and worker.lost_at is not None and not self._has_cameras(worker):
            return
        log.warning("fleet %s: %s; moving its cameras", self.fleet, why)
        wall = worker.last_ok_wall or time.time()  # the last moment it was known to work
        worker.alive, worker.lost_at, worker.running = False, time.monotonic(), {}
        for cid, index in list(self.placement.items()):
            if index != worker.index:
                continue
            st = self.state[cid]
            if st.down_since is None:
                st.down_since, st.down_reason, st.from_worker = wall, why, worker.index
            st.status, st.add_ref, st.next_try = "moving", None, 0.0
            del self.placement[cid]
            self.mirror.write(lambda pipe, cid=cid: pipe.hdel(self.keys["placement"], cid))
            self._publish_status(cid, "reconnecting", {"event": "reconnecting", "reason": f"fleet: {why}"})

    def _resumed(self, cid: str, st: _CameraState, index: int) -> None:
        outage = max(0.0, time.time() - st.down_since)
        record = {"camera": cid, "from": st.from_worker, "to": index, "reason": st.down_reason,
                  "lost_at": st.down_since, "resumed_at": time.time(), "outage_s": round(outage, 3)}
        self.outages = [record, *self.outages[:_OUTAGES_KEPT - 1]]  # newest first, as in Redis
        self.mirror.write(lambda pipe: (pipe.lpush(self.keys["outages"], json.dumps(record)),
                                        pipe.ltrim(self.keys["outages"], 0, _OUTAGES_KEPT - 1)))
        st.outage_total_s += outage
        st.last_outage_s, st.down_since = outage, None
        log.warning("fleet %s: camera %s resumed on GPU actor %d after %.1f s", self.fleet, cid, index, outage)
        self._publish_status(cid, "ok", {"event": "resumed", "outage_s": outage,
                                         "reason": f"fleet: moved from GPU actor {record['from']} to {index}"})

    def _retry_later(self, cid: str, st: _CameraState, why: str) -> None:
        st.attempts += 1
        delay = min(self.spec.retry_max_s, 2.0 ** min(st.attempts - 1, 10))
        st.status, st.error, st.next_try = "retrying", why, time.monotonic() + delay
        log.warning("fleet %s: camera %s: %s; next try in %.0f s", self.fleet, cid, why, delay)

    def _finish_adds(self) -> None:
        import ray

        for cid, st in self.state.items():
            if st.add_ref is None:
                continue
            ready, _ = ray.wait([st.add_ref], timeout=0)
            if not ready:
                continue
            ref, st.add_ref = st.add_ref, None
            try:
                reply = ray.get(ref)
            except Exception as exc:  # the worker died during the add: _lost() moves the camera
                reply = {"ok": False, "error": f"GPU actor failed ({type(exc).__name__})"}
            if reply.get("ok"):
                st.status = "starting" if st.status != "running" else st.status
            else:
                self._retry_later(cid, st, reply.get("error", "did not open"))

    def _place_and_start(self, now: float) -> None:
        """Cameras without a worker get the one with the most spare capacity, working ones first: a camera
        that keeps failing (retrying, between its tries) holds no slot that a camera moved by a failover
        needs; when its next try comes and its slot is taken meanwhile, it is placed again as a new one."""
        live = {i: w for i, w in self.workers.items() if w.alive}

        def holds(cid: str) -> bool:
            return self.state[cid].status != "retrying" or self.state[cid].add_ref is not None

        loads = {i: sum(1 for c, j in self.placement.items() if j == i and holds(c)) for i in live}
        for cid in sorted(self.cameras, key=lambda c: (self.state[c].status == "retrying", c)):
            st = self.state[cid]
            if cid in self.placement or st.add_ref is not None:
                index = self.placement.get(cid)
                worker = live.get(index) if index is not None else None
                due = st.status in ("retrying", "pending") and now >= st.next_try
                if worker is None or st.add_ref is not None or cid in worker.running or not due:
                    continue
                if st.status == "retrying" and loads[index] >= self.spec.capacity:
                    del self.placement[cid]  # its slot went to a working camera: find another, or wait
                    self.mirror.write(lambda pipe, cid=cid: pipe.hdel(self.keys["placement"], cid))
                else:
                    loads[index] += st.status == "retrying"  # (it holds its slot again while it tries)
                    st.add_ref = worker.handle.add.remote(self.cameras[cid].to_dict())
                    continue
            index = place(loads, self.spec.capacity) if live else None
            if index is None:  # every GPU actor is full ("waiting"), or none has started yet
                st.status = "waiting" if live else ("moving" if st.status == "moving" else "pending")
                continue
            loads[index] += 1
            self.placement[cid] = index
            self.mirror.write(lambda pipe, cid=cid, index=index: pipe.hset(self.keys["placement"], cid, index))
            if st.status not in ("moving",):
                st.status = "pending"
            st.add_ref = live[index].handle.add.remote(self.cameras[cid].to_dict())

    def _connect_publisher(self) -> None:
        """The PUB socket of the controller's status messages, connected to the broker now: a socket made at
        the first failover would lose that first message (ZeroMQ's slow joiner)."""
        import zmq

        if self._publisher is not None or self.spec is None:
            return
        try:
            sock = zmq.Context.instance().socket(zmq.PUB)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.setsockopt(zmq.SNDHWM, 1000)
            if self.spec.curve_dir:
                from sapiens2_client.keys import CurveClientKeys

                CurveClientKeys.from_dir(self.spec.curve_dir, self.spec.curve_client).apply(sock)
            sock.connect(self.spec.broker)
            self._publisher = sock
        except Exception:  # best effort, as the messages are; the fleet status has the same facts
            log.debug("fleet status socket not connected", exc_info=True)

    def _publish_status(self, cid: str, health: str, event: dict[str, Any]) -> None:
        """A status message for the camera through the broker, so subscribers see the outage."""
        import zmq

        from sapiens2_client import wire

        try:
            self._connect_publisher()
            fields = {"fps": 0.0, "health": health, "frames": self.state[cid].frames, "last_frame_index": -1,
                      "drops": {}, "event": {**event, "time_ns": time.time_ns()}}
            self._publisher.send_multipart(wire.encode("status", cid, fields, publish_ns=time.time_ns()),
                                           zmq.NOBLOCK)
        except Exception:  # a status message is best effort; the fleet status has the same facts
            log.debug("fleet status message for %s not sent", cid, exc_info=True)
