"""Checkpoint loading: every bad source is refused with one CheckpointError naming the culprit;
every good layout (folder, shards, bare original file, transformers' in-memory layout, hub cache)
loads and computes the same outputs. CPU, float32, tiny reference models."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from stages.sapiens2 import CheckpointError, load_model
from stages.sapiens2.tiny import make_tiny
from stages.tasks import TASKS
from tests.refutil import reference_model

REPO = Path(__file__).resolve().parents[3]
SIZE = (128, 96)


def _refused(source, *names, **kwargs) -> str:
    """load_model(source) raises CheckpointError (no model comes back); the message names every `names`."""
    model = None
    with pytest.raises(CheckpointError) as info:
        model = load_model(source, device="cpu", **kwargs)
    assert model is None
    msg = str(info.value)
    for name in names:
        assert str(name) in msg, f"{name!r} not named in: {msg}"
    assert "\n" not in msg.strip(), "one actionable line expected"
    return msg


def _ref_output(task, out):
    """The reference output our forward's first result corresponds to."""
    if task == "matting":
        return torch.cat([out.foregrounds, out.alphas], 1)
    return getattr(out, {"pose": "heatmaps", "seg": "logits", "normal": "normals", "pointmap": "pointmaps"}[task])


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-4) -> bool:
    return (a - b).abs().max().item() <= rel * max(b.abs().max().item(), 1e-12)


def _run(model, x):
    with torch.no_grad():
        return model(x)


@pytest.fixture(scope="module")
def ref_dirs(tmp_path_factory):
    """task -> (reference model, folder written by its save_pretrained)."""
    out = {}
    for task in TASKS:
        ref = reference_model(task)
        folder = tmp_path_factory.mktemp(f"ref_{task}")
        ref.save_pretrained(folder)
        out[task] = (ref, folder)
    return out


@pytest.fixture(scope="module")
def pose_dir(ref_dirs):
    return ref_dirs["pose"][1]


@pytest.fixture(scope="module")
def x():
    return torch.randn(2, 3, *SIZE, generator=torch.Generator().manual_seed(0))


def _folder_with(tmp_path: Path, pose_dir: Path, sd: dict, name: str = "ckpt", config: dict | None = None) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    cfg = json.loads((pose_dir / "config.json").read_text()) if config is None else config
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


# --- unreadable files --------------------------------------------------------------------------------------------


def test_corrupt_safetensors(tmp_path):
    path = tmp_path / "garbage.safetensors"
    path.write_bytes(os.urandom(4096))
    _refused(path, path.name, "safetensors")


def test_truncated_safetensors(tmp_path, pose_dir):
    data = (pose_dir / "model.safetensors").read_bytes()
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[: len(data) // 2])
    msg = _refused(path, path.name)
    assert "truncated" in msg or "corrupt" in msg


def test_truncated_file_in_folder(tmp_path, pose_dir):
    folder = tmp_path / "cut"
    shutil.copytree(pose_dir, folder)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    _refused(folder, "model.safetensors")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.safetensors"
    path.write_bytes(b"")
    _refused(path, path.name)


class _Trap:
    """Unpickling this creates a marker file: proof that a loader unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_unpickling_trap_is_live(tmp_path):
    """Sanity check of the trap used below: plain pickle.loads does create the marker."""
    marker = tmp_path / "marker"
    pickle.loads(pickle.dumps(_Trap(marker))).close()
    assert marker.exists()


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".bin", ".ckpt", ".safetensors"])
def test_pickle_is_refused_without_unpickling(tmp_path, suffix):
    marker = tmp_path / "unpickled.marker"
    path = tmp_path / f"sapiens2_0.4b_pose{suffix}"
    path.write_bytes(pickle.dumps({"state_dict": _Trap(marker)}))
    _refused(path, path.name)
    assert not marker.exists(), "the checkpoint was unpickled"


def test_pickle_in_folder_is_refused_without_unpickling(tmp_path, pose_dir):
    marker = tmp_path / "unpickled.marker"
    folder = tmp_path / "ckpt"
    folder.mkdir()
    shutil.copy(pose_dir / "config.json", folder / "config.json")
    (folder / "model.safetensors").write_bytes(pickle.dumps({"w": _Trap(marker)}))
    _refused(folder, "model.safetensors")
    assert not marker.exists()


def test_missing_file_and_folder(tmp_path):
    _refused(tmp_path / "nope.safetensors", "nope.safetensors")
    _refused(tmp_path / "nope_dir", "nope_dir")
    _refused(str(tmp_path / "nope_dir" / "model.safetensors"), "model.safetensors")


def test_missing_relative_path_is_not_a_hub_lookup(tmp_path, monkeypatch):
    """A relative 'dir/file.safetensors' that does not exist is a missing file, not a hub repo id."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    msg = _refused("checkpoints/sapiens2_0.4b_pose.safetensors", "checkpoints/sapiens2_0.4b_pose.safetensors")
    assert "no such" in msg, msg


def test_offline_hub_id_not_in_the_cache_is_refused_without_the_download_code(tmp_path):
    """Offline, a hub id with no folder in the cache is one clear error, said before huggingface_hub's
    download code is imported (an offline start that falls back to random weights pays nothing for it)."""
    probe = ("import sys\nfrom stages.sapiens2 import CheckpointError\nfrom stages.sapiens2.weights import locate\n"
             "try:\n    locate('facebook/sapiens2-pose-0.4b')\nexcept CheckpointError as exc:\n    print(exc)\n"
             "print('download code imported:', 'huggingface_hub._snapshot_download' in sys.modules)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    ran = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[3])
    assert ran.returncode == 0, ran.stderr
    said, imported = ran.stdout.strip().splitlines()
    assert "not in the Hugging Face cache" in said and "hf download facebook/sapiens2-pose-0.4b" in said, said
    assert imported == "download code imported: False", ran.stdout


def test_folder_without_config(tmp_path, pose_dir):
    folder = tmp_path / "noconfig"
    folder.mkdir()
    shutil.copy(pose_dir / "model.safetensors", folder / "model.safetensors")
    _refused(folder, "config.json", "noconfig")


def test_folder_without_weights(tmp_path, pose_dir):
    folder = tmp_path / "noweights"
    folder.mkdir()
    shutil.copy(pose_dir / "config.json", folder / "config.json")
    _refused(folder, "noweights", "model.safetensors")


# --- config.json ------------------------------------------------------------------------------------------------


def _with_config(tmp_path, pose_dir, text: str) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    shutil.copy(pose_dir / "model.safetensors", folder / "model.safetensors")
    (folder / "config.json").write_text(text)
    return folder


def _config(pose_dir) -> dict:
    return json.loads((pose_dir / "config.json").read_text())


def test_config_invalid_json(tmp_path, pose_dir):
    folder = _with_config(tmp_path, pose_dir, (pose_dir / "config.json").read_text()[:-20])
    msg = _refused(folder, "config.json")
    assert "JSON" in msg


def test_config_not_an_object(tmp_path, pose_dir):
    _refused(_with_config(tmp_path, pose_dir, "[1, 2]"), "config.json")


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                   "head_config"])
def test_config_missing_field(tmp_path, pose_dir, field):
    cfg = _config(pose_dir)
    del cfg[field]
    _refused(_with_config(tmp_path, pose_dir, json.dumps(cfg)), "config.json", field)


@pytest.mark.parametrize("field, value", [("hidden_size", "64"), ("num_hidden_layers", True),
                                          ("num_attention_heads", 4.0), ("intermediate_size", None),
                                          ("query_bias", "yes"), ("patch_size", [16])])
def test_config_wrong_type(tmp_path, pose_dir, field, value):
    cfg = _config(pose_dir)
    cfg[field] = value
    _refused(_with_config(tmp_path, pose_dir, json.dumps(cfg)), "config.json", field)


def test_config_head_field_wrong_type(tmp_path, pose_dir):
    cfg = _config(pose_dir)
    cfg["head_config"]["upsample_out_channels"] = "16,16"
    _refused(_with_config(tmp_path, pose_dir, json.dumps(cfg)), "config.json", "upsample_out_channels")


def test_config_head_inconsistent_lengths_names_file(tmp_path, pose_dir):
    cfg = _config(pose_dir)
    cfg["head_config"]["upsample_kernel_sizes"] = [4]  # two upsample blocks, one kernel size
    _refused(_with_config(tmp_path, pose_dir, json.dumps(cfg)), "config.json", "upsample_kernel_sizes")


@pytest.mark.parametrize("archs", [["Sapiens2ForTimeTravel"], ["ViTModel"], [], "Sapiens2ForPoseEstimation"])
def test_config_unknown_architecture(tmp_path, pose_dir, archs):
    cfg = _config(pose_dir)
    cfg["architectures"] = archs
    _refused(_with_config(tmp_path, pose_dir, json.dumps(cfg)), "config.json", "architectures")


def test_config_foreign_model_type(tmp_path, pose_dir):
    cfg = _config(pose_dir)
    cfg["model_type"] = "dinov2"
    _refused(_with_config(tmp_path, pose_dir, json.dumps(cfg)), "config.json", "model_type")


# --- tensors that do not match ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pose_sd(pose_dir):
    return load_file(str(pose_dir / "model.safetensors"))


def test_wrong_shape_names_key_and_shapes(tmp_path, pose_dir, pose_sd):
    key = "backbone.blocks.1.attn.proj.weight"
    sd = dict(pose_sd, **{key: torch.zeros(64, 32)})
    _refused(_folder_with(tmp_path, pose_dir, sd), key, "(64, 32)", "(64, 64)")


def test_wrong_shape_of_a_qkv_projection(tmp_path, pose_dir, pose_sd):
    """q/k/v are fused at load time; a bad shape there must still be a named CheckpointError."""
    key = "backbone.blocks.0.attn.wq.weight"
    sd = dict(pose_sd, **{key: torch.zeros(64, 32)})
    _refused(_folder_with(tmp_path, pose_dir, sd), key, "(64, 32)")


@pytest.mark.parametrize("key", ["backbone.blocks.2.ffn.w3.weight", "backbone.blocks.0.attn.wq.weight"])
def test_missing_tensor_is_named(tmp_path, pose_dir, pose_sd, key):
    """Also a q projection, which the fused layout would otherwise hide inside wqkv."""
    sd = {k: v for k, v in pose_sd.items() if k != key}
    msg = _refused(_folder_with(tmp_path, pose_dir, sd), key)
    assert "missing" in msg


def test_unexpected_tensor_is_named(tmp_path, pose_dir, pose_sd):
    key = "backbone.blocks.0.attn.extra_proj.weight"
    sd = dict(pose_sd, **{key: torch.zeros(4, 4)})
    msg = _refused(_folder_with(tmp_path, pose_dir, sd), key)
    assert "unexpected" in msg


def test_predictor_for_another_task_is_refused(tmp_path, ref_dirs):
    """seg weights under a pose config.json: the head does not match."""
    seg_sd = load_file(str(ref_dirs["seg"][1] / "model.safetensors"))
    folder = _folder_with(tmp_path, ref_dirs["pose"][1], seg_sd)
    _refused(folder, "decode_head.conv_seg.weight")


# --- sharded checkpoints ----------------------------------------------------------------------------------------


def _write_shards(folder: Path, sd: dict, drop: str | None = None) -> dict:
    """Two shards + index; `drop` is listed in the index but left out of the shards."""
    folder.mkdir()
    keys = sorted(sd)
    half = len(keys) // 2
    weight_map = {}
    for i, part in enumerate((keys[:half], keys[half:])):
        name = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({k: sd[k].contiguous() for k in part if k != drop}, str(folder / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


def test_sharded_checkpoint_matches_single_file(tmp_path, pose_dir, pose_sd, x):
    folder = tmp_path / "sharded"
    _write_shards(folder, pose_sd)
    shutil.copy(pose_dir / "config.json", folder / "config.json")
    sharded, single = load_model(folder, device="cpu"), load_model(pose_dir, device="cpu")
    assert torch.equal(_run(sharded, x)[0], _run(single, x)[0])


def test_incomplete_sharded_checkpoint(tmp_path, pose_dir, pose_sd):
    folder = tmp_path / "sharded"
    key = "backbone.blocks.1.ffn.w12.weight"
    _write_shards(folder, pose_sd, drop=key)
    shutil.copy(pose_dir / "config.json", folder / "config.json")
    _refused(folder, key, "model.safetensors.index.json")


def test_sharded_checkpoint_with_missing_shard_file(tmp_path, pose_dir, pose_sd):
    folder = tmp_path / "sharded"
    _write_shards(folder, pose_sd)
    shutil.copy(pose_dir / "config.json", folder / "config.json")
    (folder / "model-00002-of-00002.safetensors").unlink()
    _refused(folder, "model-00002-of-00002.safetensors")


def test_invalid_shard_index(tmp_path, pose_dir):
    folder = tmp_path / "sharded"
    folder.mkdir()
    shutil.copy(pose_dir / "config.json", folder / "config.json")
    (folder / "model.safetensors.index.json").write_text('{"metadata": {}}')
    _refused(folder, "model.safetensors.index.json")


# --- bare original files and the reference's in-memory layout -----------------------------------------------------


@pytest.mark.parametrize("task", ["pose", "pointmap"])
def test_bare_original_file_matches_folder(tmp_path, ref_dirs, task, x):
    _, folder = ref_dirs[task]
    bare = tmp_path / f"sapiens2_0.4b_{task}.safetensors"
    shutil.copy(folder / "model.safetensors", bare)
    kwargs = {"image_size": SIZE} if task == "pointmap" else {}
    ours = load_model(bare, device="cpu", dtype="float32", **kwargs)
    want = load_model(folder, device="cpu", dtype="float32")
    assert ours.cfg.task == task and ours.source == str(bare)
    (got, got_scale), (exp, exp_scale) = _run(ours, x), _run(want, x)
    assert _close(got, exp, 1e-6)
    if task == "pointmap":
        assert _close(got_scale, exp_scale, 1e-6)


def test_bare_file_of_unknown_task_is_refused(tmp_path, pose_sd):
    path = tmp_path / "headless.safetensors"
    save_file({k: v for k, v in pose_sd.items() if not k.startswith("decode_head.")}, str(path))
    _refused(path, path.name, "task")


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("where", ["bare", "folder"])
def test_reference_memory_layout_loads(tmp_path, ref_dirs, task, where, x):
    ref, folder = ref_dirs[task]
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    assert any(k.startswith("model.embeddings.") for k in sd)
    if where == "bare":
        path = tmp_path / f"{task}_memory_layout.safetensors"
        save_file(sd, str(path))
        source = path
    else:
        source = tmp_path / "ckpt"
        source.mkdir()
        save_file(sd, str(source / "model.safetensors"))
        shutil.copy(folder / "config.json", source / "config.json")
    ours = load_model(source, device="cpu", dtype="float32", image_size=SIZE)
    assert ours.cfg.task == task
    with torch.no_grad():
        out = ref(x)
    got, scale = _run(ours, x)
    assert _close(got, _ref_output(task, out))
    if task == "pointmap":
        assert _close(scale, out.scales)


# --- hub ids ------------------------------------------------------------------------------------------------------

_HUB_PROBE = """
import sys, time
from stages.sapiens2 import CheckpointError, load_model
t = time.time()
try:
    m = load_model(sys.argv[1], device="cpu")
except CheckpointError as exc:
    print("ERR", round(time.time() - t, 2), exc)
else:
    print("OK", round(time.time() - t, 2), m.cfg.task, m.random_weights, m.source)
"""


def _probe(repo_id: str, monkeypatch, hf_home: Path) -> tuple[str, float, str]:
    """Load repo_id in a fresh interpreter (huggingface_hub reads HF_HOME at import) -> (status, seconds, rest)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", _HUB_PROBE, repo_id], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    status, seconds, rest = proc.stdout.strip().splitlines()[-1].split(" ", 2)
    return status, float(seconds), rest


def test_hub_id_offline_and_not_cached(tmp_path, monkeypatch):
    status, seconds, msg = _probe("facebook/sapiens2-pose-0.4b", monkeypatch, tmp_path / "empty_hf_home")
    assert status == "ERR", msg
    assert seconds < 20  # the failing load itself (no network retries); not the interpreter's start-up
    assert "facebook/sapiens2-pose-0.4b" in msg
    assert "download" in msg and "local" in msg, msg


def test_hub_id_in_local_cache_resolves(tmp_path, monkeypatch):
    """huggingface_hub's cache layout: hub/models--org--name/snapshots/<commit>/ + refs/main."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf_home" / "hub" / "models--facebook--sapiens2-pose-0.4b"
    snapshot = repo / "snapshots" / commit
    make_tiny(snapshot, "pose", image_size=SIZE)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    status, _, rest = _probe("facebook/sapiens2-pose-0.4b", monkeypatch, tmp_path / "hf_home")
    assert status == "OK", rest
    task, random_weights, source = rest.split(" ", 2)
    assert task == "pose" and random_weights == "True"
    assert Path(source) == snapshot
