"""Properties: unrelated lines, extra prefixes and cutting the log after its deciding line never
change the verdict."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.telemetry.nccl_synth import rank_init_lines
from tests.telemetry.tel_support import NCCL_LOGS
from training.logparse import NcclAnalyzer, Verdict, classify_lines, iter_file_lines

SYNTH = {
    "efa_gdr": [line for r in range(4) for line in rank_init_lines(f"n{r // 2}", 10 + r, r % 2, r, 4, 2)],
    "socket": [line for r in range(4) for line in
               rank_init_lines(f"n{r // 2}", 10 + r, r % 2, r, 4, 2, net="Socket", gdr=False)],
    "tcp_ofi": [line for r in range(4) for line in
                rank_init_lines(f"n{r // 2}", 10 + r, r % 2, r, 4, 2, provider="tcp;ofi_rxm", gdr=False)],
}
REAL = {p.name: list(iter_file_lines(p)) for p in sorted(Path(NCCL_LOGS).glob("*.log"))}
LOGS = {**SYNTH, **REAL}

noise = st.one_of(
    st.sampled_from([
        "Map: 100%|##########| 36718/36718 [00:01<00:00, 18814.36 examples/s]",
        "RTUI_METRIC {\"step\": 3, \"loss\": 6.9}",
        "THROUGHPUT steps_per_sec=0.5 tokens_per_sec=100",
        "[rank0]:W0126 07:53:00.671000 194 torch/utils/cpp_extension.py:2425] warning",
        "# Using devices", "Falling back to simple order", "fell back to the default tuner", "",
        "Using network interface ib0", "(found 4 nics)", "\x1b[31mERROR\x1b[0m something via somewhere",
    ]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\n\r"), max_size=80)
    .filter(lambda s: "NCCL" not in s),
)
prefixes = st.sampled_from([
    "", "\x1b[36m(RayTrainWorker pid=42, ip=10.0.0.9)\x1b[0m ", "(TrainController pid=7) ",
    "2026-01-26T07:53:00.671Z ", "2025-05-16T16:39:55.210-07:00", "[pod/worker-0/ray-worker] ",
    "| 2025-05-16T16:39:55.210-07:00 | ", "[2024-01-26 07:53:00,671] ", "\x1b[1m",
])


def _key(verdict: Verdict) -> tuple[object, ...]:
    return (verdict.transport, verdict.basis, verdict.nccl_version, verdict.provider, verdict.plugin_version,
            verdict.nodes)


def _noisy(base: list[str], data: st.DataObject) -> list[str]:
    prefix = data.draw(prefixes)
    noisy: list[str] = []
    for line in base:
        noisy.extend(data.draw(st.lists(noise, max_size=2)))
        noisy.append(prefix + line)
    noisy.extend(data.draw(st.lists(noise, max_size=3)))
    return noisy


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(LOGS)), data=st.data())
def test_noise_and_prefixes_do_not_change_the_verdict(name: str, data: st.DataObject) -> None:
    base = LOGS[name]
    expected = classify_lines(base)
    got = classify_lines(_noisy(base, data))
    assert _key(got) == _key(expected)
    if expected.hosts:  # a prefix may name the host of a log that had none; it never renames one
        assert (got.hosts, got.ranks) == (expected.hosts, expected.ranks)


def _deciding_line(lines: list[str]) -> int:
    """The index of the line after which the (transport, basis) of the whole log no longer changes."""
    analyzer = NcclAnalyzer()
    decided, last = 0, None
    for i, line in enumerate(lines):
        analyzer.feed(line)
        now = (analyzer.verdict().transport, analyzer.verdict().basis)
        if now != last:
            decided, last = i, now
    return decided


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(LOGS)), data=st.data())
def test_a_log_cut_after_its_deciding_line_keeps_the_verdict(name: str, data: st.DataObject) -> None:
    base = LOGS[name]
    whole = classify_lines(base)
    cut = base[: _deciding_line(base) + 1]
    got = classify_lines(_noisy(cut, data))
    assert (got.transport, got.basis) == (whole.transport, whole.basis)
