"""GPU defaults that mean something (issue 36): on a GPU cluster a run left on auto trains conversations
at a real sequence length with the largest micro-batch the plan's memory estimate fits on the node
type's GPU; a model that does not fit even one sequence is refused at plan time, with what would fit.

The estimate is the one the plan line prints (``backend.jobspec``, docs/perf-model.md); these tests
compare against it rather than against figures copied here, so a better estimate keeps them true.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from backend.config import RunConfig, config_for
from backend.errors import UserError
from backend.jobspec import build_job_spec
from backend.layers.base import Context
from backend.layers.ray_job import RayJobLayer
from backend.stepfit import AUTO_MICRO_BATCHES, gpu_budget_gib, memory_refusal, model_shape, step_memory_gib
from backend.store import RunStore
from targets import GPU_SEQ_LEN
from targets.aws.config import AwsConfig
from targets.local.config import LocalConfig
from tests.conftest import run_rtui


def _entry(config: RunConfig) -> list[str]:
    return shlex.split(build_job_spec(config, "0" * 40).entrypoint)


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("target", ["aws", "kube"])
def test_a_gpu_run_left_on_auto_gets_a_real_sequence_and_the_largest_batch_that_fits(target: str) -> None:
    config = config_for(target)
    assert config.effective_seq_len() == GPU_SEQ_LEN >= 1024
    batch = config.effective_batch_size()
    budget = gpu_budget_gib(config)
    assert budget is not None and model_shape(config) is not None
    # The largest of the candidates whose estimate fits: it fits, the next larger one does not.
    assert step_memory_gib(config.model_copy(update={"batch_size": batch})) <= budget
    larger = [b for b in AUTO_MICRO_BATCHES if b > batch]
    assert larger, "the default model should not fit every candidate: the choice would not be tested"
    assert step_memory_gib(config.model_copy(update={"batch_size": min(larger)})) > budget
    assert batch > 1  # the old default (1 × 128) used a fraction of an L4
    args = _entry(config)
    assert _flag(args, "--seq-len") == str(GPU_SEQ_LEN) and _flag(args, "--batch-size") == str(batch)
    # What the user sets is kept.
    mine = config_for(target, seq_len=256, batch_size=3)
    assert (mine.effective_seq_len(), mine.effective_batch_size()) == (256, 3)


def test_the_local_target_keeps_its_cpu_sizes() -> None:
    config = LocalConfig(target="local")
    assert (config.effective_seq_len(), config.effective_batch_size()) == (128, 32)
    assert gpu_budget_gib(config) is None and memory_refusal(config) is None


def test_a_gpu_rtui_does_not_know_gets_one_sequence_and_the_jobs_own_check() -> None:
    config = AwsConfig(target="aws", gpu_node_type="p5.48xlarge", gpus_per_node=8)
    assert gpu_budget_gib(config) is None
    assert config.effective_batch_size() == 1 and memory_refusal(config) is None


def test_a_sequence_length_below_eight_is_refused_and_zero_is_auto() -> None:
    with pytest.raises(ValueError, match="seq_len"):
        LocalConfig(seq_len=4)
    assert AwsConfig(target="aws", seq_len=0).effective_seq_len() == GPU_SEQ_LEN


def test_a_model_that_does_not_fit_one_sequence_is_refused_with_what_would_fit() -> None:
    config = AwsConfig(target="aws", model_id="Qwen/Qwen2.5-7B")
    assert config.effective_batch_size() == 1
    budget = gpu_budget_gib(config)
    assert budget is not None and step_memory_gib(config) > budget
    refusal = memory_refusal(config)
    assert refusal is not None
    assert "Qwen/Qwen2.5-7B" in refusal.message and "L4" in refusal.message and "\n" not in refusal.message
    remedy = str(refusal.remedy)
    # Each way out it names fits by the same estimate.
    seq = int(remedy.split("--seq-len ")[1].split()[0].rstrip(","))
    nodes = int(remedy.split("--gpu-node-count ")[1].split()[0].rstrip(","))
    assert step_memory_gib(config.model_copy(update={"seq_len": seq})) <= budget
    assert step_memory_gib(config.model_copy(update={"gpu_node_count": nodes})) <= budget
    assert step_memory_gib(config.model_copy(update={"gpu_node_count": nodes - 1})) > budget
    # A size that fits is not refused.
    assert memory_refusal(config.model_copy(update={"seq_len": seq})) is None
    assert memory_refusal(AwsConfig(target="aws")) is None


async def test_the_plan_refuses_it_before_asking_the_hub(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "state")
    config = AwsConfig(target="aws", model_id="Qwen/Qwen2.5-7B")
    ctx = Context(config, store.create(config), store)
    with pytest.raises(UserError, match="does not fit"):
        await RayJobLayer().prepare(ctx)  # no Hub in this test: the refusal comes first


def test_with_tokens_per_step_the_auto_batch_divides_the_sequences_each_rank_takes() -> None:
    # 24,576 tokens = 3 sequences of 1024 per rank on 8 GPUs: only 1 and 3 divide it (16, 8, 4, 2 do not).
    config = AwsConfig(target="aws", tokens_per_step=24576)
    assert config.effective_batch_size() == 1
    assert memory_refusal(config) is None


def test_config_show_with_tokens_per_step_is_not_a_traceback() -> None:
    proc = run_rtui("config", "show", "--target", "aws", "--tokens-per-step", "24576")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
