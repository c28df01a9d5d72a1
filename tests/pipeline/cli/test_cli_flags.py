"""The run flags are generated from RunConfig: every key has a flag with its help, and a flag sets its key."""

from __future__ import annotations

import argparse
import typing

import pytest

from pipeline.cli.args import overrides_from
from pipeline.cli.config import FIELDS, HINTS, load_config
from pipeline.cli.main import build_parser

# A value to give each kind of flag on the command line, and what the key must then hold.
SAMPLES = {
    bool: ("", True),
    int: ("7", 7),
    float: ("0.5", 0.5),
}


def _run_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


def test_every_config_key_has_a_flag_with_help() -> None:
    by_dest = {a.dest: a for a in _run_parser()._actions}
    for name, f in FIELDS.items():
        if not f.metadata.get("cli", True):
            continue
        assert name in by_dest, f"{name} has no flag"
        assert by_dest[name].help, f"--{name} has no help text"


def test_the_help_shows_each_default() -> None:
    """Flags default to None (a flag left out overrides nothing in the YAML), so the help states the
    field's own default: it showed none before."""
    text = _run_parser().format_help()
    for shown in ("(default: pose,seg)", "(default: 1024x768)", "(default: 0.3)", "(default: 80)",
                  "(default: matte,seg,boxes,pose,side3d,hud)", "(default: on)"):
        assert shown in " ".join(text.split()), shown


@pytest.mark.parametrize("name", [n for n, f in FIELDS.items() if f.metadata.get("cli", True)])
def test_a_flag_sets_its_key(name: str) -> None:
    action = next(a for a in _run_parser()._actions if a.dest == name)
    flag = action.option_strings[0]
    hint = HINTS[name]
    base = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
    if action.choices:
        text, want = str(list(action.choices)[-1]), list(action.choices)[-1]
    elif name in ("pose_input", "dense_input"):
        text, want = "512x384", [512, 384]
    elif name == "checkpoints":
        text, want = "pose=/x", {"pose": "/x"}
    elif name in ("channels_last", "gpu_jpeg"):
        text, want = "on", True
    elif name == "tasks":
        text, want = "pose,matting", ["pose", "matting"]
    elif name == "annotate":
        text, want = "pose,hud", ["pose", "hud"]
    elif name == "det_imgsz":
        text, want = "320", 320
    elif name in ("publish", "publish_connect", "control"):
        text, want = "tcp://127.0.0.1:5599", "tcp://127.0.0.1:5599"
    elif name == "device":
        text, want = "cuda:1", "cuda:1"
    elif name in ("view", "metrics"):
        text, want = "127.0.0.1:8089", "127.0.0.1:8089"
    elif name == "source":
        text, want = "lobby=demo", ["lobby=demo"]
    elif name == "source_id":
        text, want = "cam-7", "cam-7"
    elif name == "export_trc":
        text, want = "out/run.trc", "out/run.trc"
    elif base in SAMPLES:
        text, want = SAMPLES[base]
    else:
        text, want = "value-" + name, "value-" + name
    if base is bool and name not in ("channels_last", "gpu_jpeg"):
        argv, want = [flag] if RUN_DEFAULTS[name] is False else [f"--no-{flag[2:]}"], not RUN_DEFAULTS[name]
    else:
        argv = [flag, text]
    companions = [a for a in NEEDS.get(name, []) if a != flag]
    overrides = overrides_from(build_parser().parse_args(["run", *argv, *companions]))
    assert name in overrides and len(overrides) == 1 + len([a for a in companions if a.startswith("--")])
    assert getattr(load_config(None, overrides), name) == want


# Flags that take effect only beside others (a key refused on its own): what each needs.
NEEDS = {name: ["--triangulate", "--calibration", "rig.toml"] for name in ("triangulate", "save_world", "export_trc")}


RUN_DEFAULTS = {name: getattr(load_config(None), name) for name in FIELDS}


def test_a_yaml_size_is_written_as_on_the_command_line(tmp_path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("pose_input: 256x192\ndense_input: [512, 384]\n")
    cfg = load_config(config)
    assert cfg.pose_input == [256, 192] and cfg.dense_input == [512, 384]


@pytest.mark.parametrize("content, needle", [
    (b"pose_input: 256y192\n", "pose_input: expected HEIGHTxWIDTH"),
    (b"\xff\xfe\x00", "not a UTF-8 text file"),
    (b"record_fragment_s: 1000000000.0\n", "record_fragment_s: at most 60"),
    (None, "is a folder"),
])
def test_a_bad_config_file_is_named_with_what_is_wrong(tmp_path, content: bytes | None, needle: str) -> None:
    from pipeline.cli.config import ConfigError

    config = tmp_path / "c.yaml"
    if content is None:
        config.mkdir()
    else:
        config.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert str(caught.value).startswith(str(config)) and needle in str(caught.value), caught.value
