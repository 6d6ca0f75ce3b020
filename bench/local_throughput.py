"""Local target, measured the way a user runs it: Ray Train FSDP2 vs a plain torch loop.

One script, same machine, same cores, same model and global batch:
  (a) `rtui up --yes` on the local target: a real Ray cluster, 2 Ray Train workers, FSDP2 on gloo;
  (b) bench/plain_loop.py: one process, the same model and global batch, torch threads = cores.
Reports the tokens/s ratio (goal >= 0.75x), the time from `up` to the first metric line, and
the peak memory (sum of PSS over every process of the run, sampled every 0.5 s).
Run: .venv/bin/python bench/local_throughput.py [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from backend.store import RunStore  # noqa: E402
from targets.local.cluster import cluster_family, find_clusters  # noqa: E402
from training.protocol import SUMMARY_TAG, parse_record  # noqa: E402


def sample_memory(cluster_name: str, rtui_pid: int, stop: threading.Event, peak: list[int]) -> None:
    """Peak PSS of rtui and every process of the run's local cluster (found as teardown finds them)."""
    while not stop.is_set():
        procs: list[psutil.Process] = []
        try:
            procs.append(psutil.Process(rtui_pid))
            for cluster in find_clusters(cluster_name=cluster_name):
                procs += cluster_family(cluster.path)
        except (psutil.Error, OSError, ValueError):
            pass
        total = 0
        for p in {p.pid: p for p in procs}.values():
            try:
                total += p.memory_full_info().pss
            except psutil.Error:
                continue
        peak[0] = max(peak[0], total)
        stop.wait(0.5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    args, rtui_flags = parser.parse_known_args()  # anything else goes to `rtui up` (e.g. --batch-size 16)
    rtui = str(Path(sys.executable).parent / "rtui")
    cores = os.cpu_count() or 2
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        env = {**os.environ, "RTUI_STATE_DIR": str(state), "RTUI_CONFIG_DIR": f"{tmp}/cfg"}
        cluster_name = f"bench-{os.getpid()}"
        flags = ["--steps", str(args.steps), "--cluster-name", cluster_name, *rtui_flags]
        started = time.time()
        up = subprocess.Popen([rtui, "up", "--yes", "--json", *flags], stdout=subprocess.PIPE, text=True,
                              env=env, cwd=tmp)
        stop, peak = threading.Event(), [0]
        sampler = threading.Thread(target=sample_memory, args=(cluster_name, up.pid, stop, peak), daemon=True)
        sampler.start()
        first_metric = None
        run_id = None
        assert up.stdout is not None
        for line in up.stdout:
            event = json.loads(line)
            run_id = run_id or event["data"].get("run_id")
            if first_metric is None and event["step"] == "train" and event["kind"] == "progress":
                first_metric = event["ts"] - started
        rc = up.wait()
        stop.set()
        sampler.join()
        if rc != 0 or run_id is None:
            sys.exit(f"rtui up failed ({rc})")
        record = RunStore(state).load(run_id)
        summary = None
        for spool_line in Path(record.job_spool_path()).read_text().splitlines():
            parsed = parse_record(spool_line) if SUMMARY_TAG in spool_line else None
            if parsed:
                summary = parsed[1]
        config = record.config
        subprocess.run([rtui, "down", run_id, "--yes"], env=env, cwd=tmp, check=True, capture_output=True)
    assert summary is not None
    workers, ray_tps = summary["world_size"], summary["tokens_per_s_mean"]
    per_worker_batch = config.effective_batch_size()
    global_batch = workers * per_worker_batch
    tiny = config.target_defaults().tiny
    plain = subprocess.run(
        [sys.executable, str(REPO / "bench" / "plain_loop.py"), "--steps", str(args.steps),
         "--batch-size", str(global_batch), "--threads", str(cores), "--precision", "fp32",
         "--hidden", str(tiny.hidden_size), "--layers", str(tiny.layers),
         "--heads", str(tiny.heads), "--vocab", str(tiny.vocab_size),
         "--seq-len", str(config.effective_seq_len())],
        capture_output=True, text=True, check=True, cwd=REPO)
    plain_tps = json.loads(plain.stdout.strip().splitlines()[-1])["tokens_per_s_mean"]
    print(f"Ray Train FSDP2, {workers} workers x batch {per_worker_batch}: {ray_tps:,.0f} tokens/s (steady mean)")
    print(f"plain torch loop, 1 process x {cores} threads, batch {global_batch}: {plain_tps:,.0f} tokens/s")
    print(f"ratio FSDP2 / plain: {ray_tps / plain_tps:.2f}x (goal >= 0.75x)")
    print(f"time from `rtui up` to the first metric line: {first_metric:.1f} s")
    print(f"peak memory of the run (PSS, rtui + every Ray process): {peak[0] / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
