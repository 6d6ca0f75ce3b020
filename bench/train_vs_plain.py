"""Tiny-model tokens/s: (a) the training program under Ray Train FSDP2 vs (b) a plain torch loop, same cores.

(a) ``python -m training.train`` with the local target's defaults (2 workers × per-worker batch 8,
fp32, OMP_NUM_THREADS=1 per worker, reshard after forward off on CPU), its own private Ray;
(b) ``bench/plain_loop.py``: one process, global batch 16, torch threads = cores. Both report the
steady mean (first steps dropped). Goal: (a) >= 0.75 × (b).
Run: .venv/bin/python bench/train_vs_plain.py [--steps 60] [--py-spy out.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from training.protocol import SUMMARY_TAG, parse_record  # noqa: E402

SHAPE = {"seq_len": 128, "hidden": 64, "layers": 2, "heads": 4, "vocab": 1024}


def profile_worker(out: str, stop: threading.Event) -> None:
    """py-spy the rank-0 worker for 15 s once it is training (it is the one printing metrics)."""
    while not stop.is_set():
        found = subprocess.run(["pgrep", "-f", "RayTrainWorker"], capture_output=True, text=True).stdout.split()
        if found:
            time.sleep(20)  # past model build and the first steps
            subprocess.run([shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"), "record",
                            "-p", found[0], "-d", "15", "-r", "50", "--format", "raw", "-o", out, "--nonblocking"],
                           capture_output=True)
            return
        time.sleep(0.5)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--per-worker-batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--py-spy", default=None, help="write a raw py-spy profile of one worker here")
    a = p.parse_args()
    cores = os.cpu_count() or 2
    env = {**os.environ, "RAY_TRAIN_ENABLE_PRINT_PATCH": "0", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    stop = threading.Event()
    if a.py_spy:
        threading.Thread(target=profile_worker, args=(a.py_spy, stop), daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        ray_run = subprocess.run(
            [sys.executable, "-m", "training.train", "--steps", str(a.steps), "--num-workers", str(a.workers),
             "--batch-size", str(a.per_worker_batch), "--precision", "fp32", "--device", "cpu", "--data", "random",
             "--seq-len", str(SHAPE["seq_len"]), "--tiny-hidden-size", str(SHAPE["hidden"]),
             "--tiny-layers", str(SHAPE["layers"]), "--tiny-heads", str(SHAPE["heads"]),
             "--tiny-vocab-size", str(SHAPE["vocab"]), "--storage-path", tmp],
            capture_output=True, text=True, env=env, cwd=REPO)
    stop.set()
    summary = next((r[1] for r in map(parse_record, ray_run.stdout.splitlines()) if r and r[0] == SUMMARY_TAG), None)
    if ray_run.returncode != 0 or summary is None:
        sys.exit(f"training run failed ({ray_run.returncode}):\n{ray_run.stdout[-2000:]}\n{ray_run.stderr[-2000:]}")
    global_batch = a.workers * a.per_worker_batch
    plain = subprocess.run(
        [sys.executable, str(REPO / "bench" / "plain_loop.py"), "--steps", str(a.steps), "--batch-size",
         str(global_batch), "--threads", str(cores), "--precision", "fp32", "--hidden", str(SHAPE["hidden"]),
         "--layers", str(SHAPE["layers"]), "--heads", str(SHAPE["heads"]), "--vocab", str(SHAPE["vocab"]),
         "--seq-len", str(SHAPE["seq_len"])], capture_output=True, text=True, check=True, cwd=REPO)
    plain_tps = json.loads(plain.stdout.strip().splitlines()[-1])["tokens_per_s_mean"]
    ray_tps = summary["tokens_per_s_mean"]
    print(json.dumps({"ray_fsdp2_tokens_per_s": ray_tps, "plain_tokens_per_s": round(plain_tps, 1),
                      "ratio": round(ray_tps / plain_tps, 3), "workers": a.workers, "global_batch": global_batch,
                      "steps": a.steps, "load_avg": os.getloadavg()}))


if __name__ == "__main__":
    main()
