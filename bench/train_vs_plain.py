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


def profile_workers(out: str, stop: threading.Event, driver: list[int]) -> None:
    """py-spy this run's training workers (descendants of our driver; other people's Ray runs on the
    machine are left alone) for 10 s once they train (use --steps >= 150 so they still do)."""
    import psutil

    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    while not stop.is_set():
        found = []
        if driver:
            try:
                found = [str(c.pid) for c in psutil.Process(driver[0]).children(recursive=True)
                         if "RayTrainWorker" in " ".join(c.cmdline())]
            except psutil.Error:
                found = []
        if len(found) >= 2:
            time.sleep(15)  # past worker start, model build and the first steps
            procs = [subprocess.Popen([pyspy, "record", "-p", pid, "-d", "10", "-r", "50", "--format", "raw",
                                       "-o", f"{out}.{pid}", "--nonblocking"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL) for pid in found]
            for proc in procs:
                proc.wait()
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
    stop, driver = threading.Event(), list[int]()
    if a.py_spy:
        threading.Thread(target=profile_workers, args=(a.py_spy, stop, driver), daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-m", "training.train", "--steps", str(a.steps), "--num-workers", str(a.workers),
             "--batch-size", str(a.per_worker_batch), "--precision", "fp32", "--device", "cpu", "--data", "random",
             "--seq-len", str(SHAPE["seq_len"]), "--tiny-hidden-size", str(SHAPE["hidden"]),
             "--tiny-layers", str(SHAPE["layers"]), "--tiny-heads", str(SHAPE["heads"]),
             "--tiny-vocab-size", str(SHAPE["vocab"]), "--storage-path", tmp],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
        driver.append(proc.pid)
        out, err = proc.communicate()
        ray_run = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
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
