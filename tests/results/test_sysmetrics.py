"""Systems metrics (issue 25, part 4): the FLOPs of a step, the device's peak, peak memory and
the spread of the step time over the ranks, from the worker's ``system`` events to `status RUN`
and `compare`."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from mlbench.results.events import read_run_events
from mlbench.results.store import RunStore
from mlbench.results.summary import summarize
from mlbench.results.sysmetrics import BUSY, WALL, describe_system, system_metrics
from mlbench.tasks.datasets import EPSILON_FEATURES
from mlbench.tasks.registry import get_task
from mlbench.tasks.flops import counted_flops, logistic_regression_flops
from mlbench.worker.sysmetrics import DevicePeak, IntervalSampler, cpu_peak_flops, current_rss_bytes, gpu_peak_flops
from tests.helpers import mlbench


def test_a_logistic_regression_step_is_two_matrix_vector_products():
    # score X w: B x D multiply-adds; gradient X^T s: as many; 2 FLOPs per multiply-add
    assert logistic_regression_flops(100, 2000) == 2 * 100 * 2000 + 2 * 100 * 2000 == 800_000


def test_a_counted_step_is_three_forward_passes_of_the_batch():
    model = nn.Sequential(nn.Linear(10, 3), nn.ReLU(), nn.Linear(3, 2), nn.BatchNorm1d(2))
    running = model[3].running_mean.clone()
    flops = counted_flops(model, torch.randn(1, 10), batch=5)
    assert flops == 3 * (2 * 10 * 3 + 2 * 3 * 2) * 5
    assert model.training and torch.equal(model[3].running_mean, running)  # no statistics updated


def test_counting_a_steps_flops_records_no_autograd_graph():
    seen = []
    model = nn.Linear(4, 2)
    model.register_forward_hook(lambda module, args, out: seen.append(out.requires_grad))
    counted_flops(model, torch.randn(1, 4), batch=1)
    assert seen == [False]   # a forward pass only: no graph kept for a backward that never comes


COUNT_IN_A_FRESH_PROCESS = """
import sys, torch
from torch.utils import flop_counter
from mlbench.tasks.flops import counted_flops
from mlbench.tasks.models import build_model
model, sample = build_model('resnet20'), torch.zeros(1, 3, 32, 32)
first = counted_flops(model, sample, 8)
print('dynamo loaded by the count:', 'torch._dynamo' in sys.modules)
print('wrapper left as torch made it:', not hasattr(flop_counter._FlopCounterMode.__torch_dispatch__.__wrapped__,
                                                    '__dynamo_disable'))
import torch._dynamo
print('same count with dynamo loaded:', counted_flops(model, sample, 8) == first, first)
"""


def test_a_fresh_worker_counts_its_flops_without_loading_dynamo_and_counts_the_same():
    """The flop counter's dispatch is wrapped in torch's ``_disable_dynamo``, whose first call
    imported torch._dynamo and sympy: 1.37 CPU-seconds of every worker that starts as a fresh
    process (Slurm's tasks, torchrun's, a pod's). The count now leaves dynamo unloaded, and
    counts what it counts with dynamo loaded; torch's wrapper is left as torch made it."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", COUNT_IN_A_FRESH_PROCESS], capture_output=True, text=True,
                          timeout=240)
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["dynamo loaded by the count: False", "wrapper left as torch made it: True"], (
        proc.stdout + proc.stderr[-2000:])
    assert lines[2].startswith("same count with dynamo loaded: True"), proc.stdout + proc.stderr[-2000:]


def _decomposed_flops(model, *inputs) -> int:
    """What torch's flop counter counts of ``model(*inputs)`` with the LSTM and attention kernels it
    cannot see (oneDNN's LSTM, the CPU's fused attention) switched to their decomposed forms."""
    import warnings

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note on oneDNN's TF32 when its flags are set
        with torch.backends.mkldnn.flags(enabled=False), sdpa_kernel(SDPBackend.MATH), counter, torch.no_grad():
            model(*inputs)
    return int(counter.get_total_flops())


def test_the_awd_lstm_step_is_counted_analytically_as_the_flop_counter_counts_it():
    from mlbench.tasks.task3a.runtime import LanguageModelRuntime
    from mlbench.tasks.task3a.settings import LanguageModelSettings

    settings = LanguageModelSettings(embedding=8, hidden=12, layers=2, bptt=6, batch_per_worker=4,
                                     synthetic_tokens=(240, 100), synthetic_vocab=50)
    runtime = LanguageModelRuntime(settings, synthetic=True, rank=1, world=2)
    model = runtime.model.eval()
    steps, counted = 0, 0
    for batch in runtime.batches(0):  # random lengths: the step's count is the epoch's mean
        counted += _decomposed_flops(model, batch.data, model.init_hidden(batch.data.size(1)))
        steps += 1
    assert steps > 3 and counted > 0
    assert runtime.flops_per_step() == ((3 * counted + steps // 2) // steps, "analytic x3")


def test_the_transformer_step_is_counted_analytically_as_the_flop_counter_counts_it():
    from mlbench.tasks.task4b.runtime import TranslationRuntime
    from mlbench.tasks.task4b.settings import TranslationSettings

    settings = TranslationSettings(dim=16, ffn=32, heads=4, encoder_layers=2, decoder_layers=1, vocab_size=40,
                                   synthetic_pairs=(30, 4), batch_per_worker=256, global_tokens=1024,
                                   batch_multiple=1)
    runtime = TranslationRuntime(settings, synthetic=True, rank=1, world=2)
    model = runtime.model.eval()
    steps, counted = 0, 0
    for step in runtime.batches(0):  # padded shapes differ from step to step: the mean
        for mb in step.micro:
            counted += _decomposed_flops(model, mb.src, mb.tgt_in)
        steps += 1
    assert steps > 1 and counted > 0
    assert runtime.flops_per_step() == ((3 * counted + steps // 2) // steps, "analytic x3")


def test_gpu_peaks_come_from_the_data_sheet_of_the_model_and_precision():
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12
    assert gpu_peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert gpu_peak_flops("NVIDIA A100-SXM4-80GB", "fp32") == 19.5e12
    # a convolutional model's fp32 run: cuDNN's convolutions run in TF32 unless told not to
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3", "fp32", convolutional=True) == 494.7e12
    allowed = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = False
        assert gpu_peak_flops("NVIDIA H100 80GB HBM3", "fp32", convolutional=True) == 67e12
    finally:
        torch.backends.cudnn.allow_tf32 = allowed
    assert gpu_peak_flops("NVIDIA V100-SXM2-16GB", "bf16") is None
    # fp16 (task 4b's mixed precision where bf16 is missing): the tensor cores' half-precision rate
    assert gpu_peak_flops("NVIDIA V100-SXM2-16GB", "fp16") == 125e12
    assert gpu_peak_flops("NVIDIA H200", "fp16") == gpu_peak_flops("NVIDIA H200", "bf16") == 989.4e12
    assert gpu_peak_flops("Some Future GPU", "fp32") is None


def test_the_cpu_probe_measures_without_touching_the_runs_random_stream():
    torch.manual_seed(7)
    before = torch.get_rng_state()
    assert cpu_peak_flops("fp32", size=64) > 0
    assert torch.equal(torch.get_rng_state(), before)


def _event(rank, name, value, step=4):
    return {"time": 1.0, "rank": rank, "epoch": 0.1, "step": step, "name": name, "value": value}


def _system(peak_flops=1e9, train_time=2.0, steps=4, flops=1_000_000):
    return {"device": "cpu", "peak_rss_bytes": 5_000_000, "cuda_peak_bytes": None, "peak_flops": peak_flops,
            "peak_source": "gemm probe", "flops_per_step": flops, "flops_method": "analytic", "steps": steps,
            "train_time": train_time}


def test_the_spread_is_of_each_ranks_busy_time_per_step_and_names_the_slowest():
    events = []
    for rank, (forward, communication) in enumerate([(0.5, 1.5), (1.5, 0.5), (1.0, 1.0)]):
        events += [_event(rank, "time/forward", forward), _event(rank, "time/optimizer", 0.5),
                   _event(rank, "time/communication", communication), _event(rank, "system", _system())]
    metrics = system_metrics(summarize(events))
    assert metrics is not None and metrics.step_basis == BUSY
    assert [r.step_seconds for r in metrics.ranks] == [1.0 / 4, 2.0 / 4, 1.5 / 4]  # communication left out
    assert (metrics.step_min, metrics.step_median, metrics.step_max) == (1.0 / 4, 1.5 / 4, 2.0 / 4)
    assert metrics.slowest_rank == 1
    # FLOPs of the steps over the training time, against the peak: 1e6 x 4 / 2 s = 2 MFLOP/s a rank
    assert [r.achieved_flops for r in metrics.ranks] == [2e6, 2e6, 2e6]
    assert metrics.achieved_flops == 6e6 and metrics.utilisation == 6e6 / 3e9
    assert metrics.peak_rss_bytes == 5_000_000


def test_without_phase_times_the_step_is_the_wall_clock_one():
    metrics = system_metrics(summarize([_event(0, "system", _system(train_time=2.0, steps=4))]))
    assert metrics is not None and metrics.step_basis == WALL
    assert metrics.step_min == metrics.step_max == 0.5 and metrics.slowest_rank == 0
    assert system_metrics(summarize([_event(0, "train/loss", 0.5)])) is None


def test_a_model_whose_flops_are_not_counted_says_so():
    record = {**_system(), "flops_per_step": None, "flops_method": None}
    metrics = system_metrics(summarize([_event(0, "system", record)]))
    assert metrics is not None and metrics.achieved_flops is None and metrics.utilisation is None
    assert ("achieved", "not counted for this task's model") in describe_system(metrics.to_dict())


def test_a_rank_that_beats_its_cpu_probe_shows_no_utilisation_and_says_why():
    """Rank 1's probe was slowed (0.5 GFLOP/s against rank 0's 1.0): its training's 0.57 GFLOP/s
    is 114% of that peak, so the run's utilisation is not shown, and compare leaves it out."""
    events = [_event(0, "system", {**_system(1e9, train_time=1.0, flops=100_000_000), "peak_probes": [0.9e9, 1e9]}),
              _event(1, "system", {**_system(0.5e9, train_time=0.7, flops=100_000_000), "peak_probes": [0.5e9]})]
    metrics = system_metrics(summarize(events))
    assert metrics is not None and metrics.ranks[1].utilisation == pytest.approx(4e8 / 0.7 / 0.5e9)
    assert metrics.utilisation is None and metrics.probe_spread == 2.0
    note = metrics.utilisation_note
    assert note == ("not shown: rank 1 reached 571.4 MFLOP/s, above its gemm probe peak of 500.0 MFLOP/s "
                    "(other processes slowed the probe)")
    achieved = dict(describe_system(metrics.to_dict()))["achieved"]
    assert achieved.endswith(f"(analytic FLOPs per step), utilisation {note}")
    assert metrics.to_dict()["ranks"][0]["peak_probes"] == [0.9e9, 1e9]


def test_cpu_probes_that_differ_make_the_utilisation_approximate_and_ones_that_agree_do_not():
    def metrics(*probes):
        record = {**_system(2e9), "peak_probes": list(probes)}
        found = system_metrics(summarize([_event(0, "system", record)]))
        assert found is not None
        return found

    agreed = metrics(1.9e9, 2e9)
    assert agreed.utilisation == pytest.approx(2e6 / 2e9) and agreed.utilisation_note is None
    apart = metrics(1.2e9, 2e9)
    assert apart.utilisation == pytest.approx(2e6 / 2e9)
    assert apart.utilisation_note == ("approximate: the CPU's probes differ 1.7x over the ranks and the run "
                                      "(other processes slowed some)")
    assert dict(describe_system(apart.to_dict()))["achieved"].endswith(f"0.1% of peak ({apart.utilisation_note})")
    # a record written before the probes were kept has none, and no note
    assert system_metrics(summarize([_event(0, "system", _system())])).utilisation_note is None


def test_a_cpu_peak_is_the_best_of_its_probes_and_a_data_sheet_stays():
    start = DevicePeak("cpu", 1e9, "gemm probe", (1e9,))
    assert start.merged(DevicePeak("cpu", 1.5e9, "gemm probe", (1.5e9,))) == DevicePeak(
        "cpu", 1.5e9, "gemm probe", (1e9, 1.5e9))
    assert start.merged(DevicePeak("cpu", 0.5e9, "gemm probe", (0.5e9,))).peak_flops == 1e9
    sheet = DevicePeak("NVIDIA H200", 989e12, "data sheet")
    assert sheet.merged(DevicePeak("NVIDIA H200", 989e12, "data sheet")) is sheet


STRAGGLER = textwrap.dedent('''
    import time

    import torch

    from mlbench.optim.base import DistributedOptimizer, all_reduce_mean_, allreduce_bytes
    from mlbench.optim.descriptors import OptimizerInfo


    class Straggler(DistributedOptimizer):
        """SGD whose rank 1 takes 0.1 s more for its update than the others."""

        info = OptimizerInfo(name="straggler", reference="a test", summary="SGD, rank 1 slow.")

        @torch.no_grad()
        def step(self, lr):
            flat = torch.cat([p.grad.reshape(-1) for p in self.params])
            all_reduce_mean_(flat, self.ctx.world_size, self.ctx.group)
            self.bytes_sent += allreduce_bytes(flat.numel(), flat.element_size(), self.ctx.world_size)
            self.ctx.timer.mark("communication")
            if self.ctx.rank == 1:
                time.sleep(0.1)
            offset = 0
            for p in self.params:
                p.add_(flat[offset:offset + p.numel()].view_as(p), alpha=-lr)
                offset += p.numel()
            self.ctx.timer.mark("optimizer")
''')


def test_each_interval_samples_the_resident_memory_and_the_cpu_used_since_the_last():
    held = bytearray(64 << 20)  # 64 MiB, touched: resident
    held[::4096] = b"x" * len(held[::4096])
    sampler = IntervalSampler(torch.device("cpu"))
    began, started = time.process_time(), time.monotonic()
    while time.process_time() - began < 0.3:  # busy: one core, or what a loaded machine gives it
        pass
    # the share of a core this process had meanwhile, as the test itself saw it
    had = 100 * (time.process_time() - began) / (time.monotonic() - started)
    busy = sampler.sample()
    time.sleep(0.3)  # idle
    idle = sampler.sample()
    assert set(busy) == {"sys/rss_bytes", "sys/cpu_percent"}  # no CUDA memory on a CPU
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    assert busy["sys/rss_bytes"] > 64 << 20
    assert busy["sys/rss_bytes"] == pytest.approx(int(status["VmRSS"].split()[0]) * 1024, rel=0.05)  # the kernel's
    assert busy["sys/cpu_percent"] == pytest.approx(had, abs=10), (busy, had)
    assert idle["sys/cpu_percent"] < min(30, busy["sys/cpu_percent"]), (busy, idle)
    del held
    assert current_rss_bytes() is not None


def test_a_real_run_records_memory_flops_and_its_straggler(tmp_path):
    plugin = tmp_path / "straggler.py"
    plugin.write_text(STRAGGLER)
    run = mlbench("run", "task2a", "2", "--data", "synthetic", "--max-steps", "3", "--log-every", "1",
                  "--optimizer", f"{plugin}:Straggler", "--device", "cpu", check=True)
    run_id = run.stdout.split()[1]
    details = json.loads(mlbench("status", run_id, "-o", "json", check=True).stdout)
    system = details["system"]
    batch = get_task("task2a").settings.batch_per_worker
    assert [r["flops_per_step"] for r in system["ranks"]] == [logistic_regression_flops(batch, EPSILON_FEATURES)] * 2
    assert system["flops_method"] == "analytic" and system["peak_source"] == "gemm probe"
    # every rank holds the synthetic training set: 40,000 x 2,000 float32
    assert system["peak_rss_bytes"] > 40_000 * EPSILON_FEATURES * 4
    assert system["step_basis"] == BUSY and system["slowest_rank"] == 1
    assert system["step_max"] >= 0.1 > system["step_min"]
    for rank in system["ranks"]:
        assert rank["utilisation"] == rank["achieved_flops"] / rank["peak_flops"]
    table = mlbench("status", run_id, check=True).stdout
    assert "slowest rank 1" in table and "analytic FLOPs per step" in table
    compared = mlbench("compare", run_id, check=True).stdout
    assert "PEAK MEM" in compared and "MFU" in compared
    # and with every logging interval, each rank's memory and CPU then (docs/system-metrics.md)
    events = read_run_events(RunStore().get(run_id).run_dir)
    sampled = {(e["rank"], e["step"], e["name"]) for e in events if e["name"].startswith("sys/")}
    assert sampled == {(rank, step, name) for rank in (0, 1) for step in (1, 2, 3)
                       for name in ("sys/rss_bytes", "sys/cpu_percent")}


def test_the_dashboards_run_page_shows_the_rows_of_status_run():
    from mlbench.dashboard.views import run_system

    events = [_event(0, "time/forward", 1.0), _event(0, "system", _system())]
    page = run_system(summarize(events))
    metrics = system_metrics(summarize(events))
    assert page is not None and metrics is not None
    assert page["rows"] == [list(row) for row in describe_system(metrics.to_dict())]
    assert page["slowest_rank"] == 0 and page["achieved_flops"] == 2e6
    assert run_system(summarize([])) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
def test_a_gpu_run_records_its_cuda_peak_memory_and_the_data_sheet_peak():
    run = mlbench("run", "task2a", "1", "--data", "synthetic", "--max-steps", "3", "--log-every", "1",
                  "--device", "cuda", check=True)
    run_id = run.stdout.split()[1]
    system = json.loads(mlbench("status", run_id, "-o", "json", check=True).stdout)["system"]
    assert system["device"] == torch.cuda.get_device_name() and system["peak_source"] == "data sheet"
    # the synthetic training set lives on the GPU: 40,000 x 2,000 float32
    assert system["cuda_peak_bytes"] > 40_000 * EPSILON_FEATURES * 4
    batch = get_task("task2a").settings.batch_per_worker
    assert system["ranks"][0]["flops_per_step"] == logistic_regression_flops(batch, EPSILON_FEATURES)
    table = mlbench("status", run_id, check=True).stdout
    assert "peak GPU memory" in table and "data sheet" in table
    events = read_run_events(RunStore().get(run_id).run_dir)
    allocated = [e["value"] for e in events if e["name"] == "sys/cuda_allocated_bytes"]
    assert len(allocated) == 3 and all(v > 40_000 * EPSILON_FEATURES * 4 for v in allocated)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
def test_a_gpu_run_of_task4b_is_measured_against_the_peak_of_its_mixed_precision():
    """Task 4b computes in bf16 (or fp16) autocast on a GPU even in an "fp32" run: its
    utilisation is against the tensor cores' peak, not plain FP32's (which it exceeded 3x)."""
    run = mlbench("run", "task4b", "1", "--data", "synthetic", "--max-steps", "3", "--log-every", "1",
                  "--device", "cuda", check=True)
    run_id = run.stdout.split()[1]
    system = json.loads(mlbench("status", run_id, "-o", "json", check=True).stdout)["system"]
    precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    expected = gpu_peak_flops(torch.cuda.get_device_name(), precision)
    assert system["ranks"][0]["peak_flops"] == expected
    assert expected is None or 0 < system["utilisation"] < 1


def test_systems_metrics_show_while_a_run_trains_and_stay_after_it_is_cancelled(libsvm_dir):
    """Each logging interval brings a ``system`` event: `status RUN` has memory and FLOP/s of an
    active run; cancelled, the run keeps them and its table row says how far it got (the epoch,
    the last test accuracy), which once was '-' in every view but `status RUN`."""
    from tests.helpers import wait_for

    proc = mlbench("run", "task2a", "2", "--data-dir", str(libsvm_dir), "--no-stop", "--set", "max_epochs=100000",
                   "--log-every", "5", "--device", "cpu", "--detach", check=True)
    run_id = proc.stdout.split("Started run ")[1].split()[0]

    def status() -> dict:
        return json.loads(mlbench("status", run_id, "-o", "json", check=True).stdout)

    live = wait_for(lambda: (s := status())["summary"]["evaluations"] and s["system"] and s, 180,
                    "an evaluation and the systems metrics of the running run")
    assert live["state"] == "running" and live["system"]["peak_rss_bytes"] > 0
    batch = get_task("task2a").settings.batch_per_worker
    assert [r["flops_per_step"] for r in live["system"]["ranks"]] == [logistic_regression_flops(batch, 40)] * 2
    assert mlbench("cancel", run_id, check=True).returncode == 0
    ended = status()
    assert ended["state"] == "cancelled" and ended["result"] is None
    assert ended["system"]["peak_rss_bytes"] >= live["system"]["peak_rss_bytes"]
    last = ended["summary"]["evaluations"][-1]
    assert ended["metric_value"] == last["accuracy"] and ended["epoch"] == ended["summary"]["epoch"] >= 1
    row = json.loads(mlbench("status", "-o", "json", check=True).stdout)["runs"][0]
    assert (row["id"], row["epoch"], row["metric_value"]) == (run_id, ended["epoch"], last["accuracy"])
    assert RunStore().get(run_id).state == "cancelled"
