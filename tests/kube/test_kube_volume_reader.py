"""The kube volume reader (issue 33, item 2): what a reader pod says is data, never where to write.

The listing and the bytes of a model on the run's volume come back as a reader pod's output, and a
pod's output is whatever its container prints: the job that wrote the volume runs the repository's
code, and an image can answer anything to ``python -c``. A hostile pod is played here by handing the
pod another program (the names it prints are the attack); rtui must refuse such names before it
writes a byte, in one line, and nothing may appear outside ``--to``. The reader pod itself runs the
image the run pinned by digest at plan time (a tag can move to other bits between two pulls:
Kubernetes "Images" docs, "Image pull operations": a digest names one image).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from targets.kube import volume_store
from targets.kube.config import KubeConfig
from tests.kube.kube_world import KubeWorld, world
from tests.kube.test_kube_storage import _in_process, _kept_run

__all__ = ["world"]  # the fixture, imported for pytest

# What a hostile reader pod prints: the honest protocol (numbered lines, END), with a model whose
# marker lists BAD besides config.json, and BAD's bytes when asked to read it.
FORGED = r"""
import base64, json, sys
BAD = __BAD__
n = 0
def out(text):
    global n
    n += 1
    print(f"{n} {text}", flush=True)
files = {"config.json": b"{}", BAD: b"pwned"}
if sys.argv[1] == "list":
    for name, data in files.items():
        out(json.dumps({"f": "rtui-train/model/" + name, "s": len(data)}))
    marker = {"format": "hf", "step": 9, "final": True, "dtype": "bf16", "files": sorted(files), "bytes": 7,
              "export_s": 0.1, "state_bytes": 1, "tokenizer": False, "eval": {}}
    out(json.dumps({"f": "rtui-train/model/rtui_model.json", "s": 10, "text": json.dumps(marker)}))
else:
    name = sys.argv[3].removeprefix("rtui-train/model/")
    offset, length = int(sys.argv[4]), int(sys.argv[5])
    out(base64.b64encode(files[name][offset:offset + length]).decode())
out("END")
"""


def _everything_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize(("bad", "exec_allowed"), [("../../x", False), ("a/../../../x", True), ("/ABS/x", False)])
def test_a_forged_listing_writes_nothing_outside_to(
        world: KubeWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        bad: str, exec_allowed: bool) -> None:
    run_id, _, _ = _kept_run(world, tmp_path, {"config.json": b"{}"})
    home = tmp_path / "home"
    (home / "ABS").mkdir(parents=True)
    bad = bad.replace("/ABS", str(home / "ABS"))
    if not exec_allowed:  # the pod-log path: every byte comes from the pod's printed lines
        world.cluster.forbid("create", "pods/exec", "rtui")
    monkeypatch.setattr(volume_store, "READER", FORGED.replace("__BAD__", json.dumps(bad)))
    _in_process(world, monkeypatch)
    from tui import cli

    before = _everything_under(home)
    capsys.readouterr()
    code = cli.main(["model", run_id, "--to", str(home / "models" / "to")])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == 2, text
    refused = [ln for ln in text.splitlines() if json.dumps(bad) in ln]
    assert refused and "nothing was written" in refused[0] and "Traceback" not in text, text
    assert _everything_under(home) == before


def test_the_reader_pod_runs_the_image_the_run_pinned(
        world: KubeWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, _, _ = _kept_run(world, tmp_path, {"config.json": b"{}"})
    [ray] = world.cluster.objects("RayCluster", "rtui")
    pinned = ray["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    assert "@sha256:" in pinned  # what the run's pods pull
    world.rtui("down", "--yes")  # the RayCluster is gone; the volume and the run's record stay

    images: list[str] = []
    runs = world.control._run_to_end

    def kubelet(pod: dict[str, Any], nodes: list[dict[str, Any]]) -> None:  # notes each reader pod's image
        images.append(pod["spec"]["containers"][0]["image"])
        runs(pod, nodes)

    monkeypatch.setattr(world.control, "_run_to_end", kubelet)
    _in_process(world, monkeypatch)
    from tui import cli

    to = tmp_path / "model"
    assert cli.main(["model", run_id, "--to", str(to)]) == 0
    assert (to / "config.json").read_bytes() == b"{}"
    assert images and set(images) == {pinned}, images


@pytest.mark.parametrize("line", ['{"f": "rtui-train/model/config.json"}', '{"f": 7, "s": 2}', "not json",
                                  '{"f": "config.json", "s": "big"}', '["f", "s"]', '{"f": "c", "s": -1}'])
def test_a_listing_line_that_is_not_an_entry_is_one_line(
        world: KubeWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        line: str) -> None:
    run_id, _, _ = _kept_run(world, tmp_path, {"config.json": b"{}"})
    program = f"import sys\nprint('1 ' + {line!r})\nprint('2 END')\n"
    monkeypatch.setattr(volume_store, "READER", program)
    _in_process(world, monkeypatch)
    from tui import cli

    capsys.readouterr()
    code = cli.main(["model", run_id, "--to", str(tmp_path / "to")])
    text = "".join(capsys.readouterr())
    said = [ln for ln in text.splitlines() if "listing" in ln]
    assert code == 1 and said and "not an entry" in said[0] and "Traceback" not in text, text


def test_a_run_without_a_recorded_digest_pins_the_tag_now_or_says_why_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from backend.errors import UserError
    from tests.kube.fake_registry import FakeRegistry

    monkeypatch.setenv("RTUI_STATE_DIR", str(tmp_path / "state"))
    with FakeRegistry() as registry:  # a run whose record holds no digest: the registry is asked, as at plan time
        config = KubeConfig(target="kube", storage_size="50Gi", image=registry.image())
        image = volume_store.run_image(config, "r20260101-000000-abcd", tmp_path / "state")
        assert image.startswith(registry.image() + "@sha256:")
    gone = KubeConfig(target="kube", storage_size="50Gi", image="127.0.0.1:9/rtui/ray:test")  # nothing listens
    with pytest.raises(UserError, match="cannot pin the image of the pod that reads the run's volume"):
        volume_store.run_image(gone, "r20260101-000000-abcd", tmp_path / "state")
    allowed = KubeConfig(target="kube", storage_size="50Gi", image=gone.image, allow_unpinned=True)
    assert volume_store.run_image(allowed, "r20260101-000000-abcd", tmp_path / "state") == gone.image
