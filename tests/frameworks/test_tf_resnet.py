"""The TensorFlow ResNet of task 1a (mlbench/tasks/task1a/tf_model.py) trains as mlbench's PyTorch ResNet.

Both start from the weights mlbench's reference draws (``ResNetPort.from_reference``) and train
on the same arrays: real CIFAR-10 images (the suite's subset), the task's sample order
(``epoch_batches``), augmented and normalised by mlbench's own pipeline, with the task's rate
rule, Nesterov momentum 0.9 and weight decay 1e-4. The float32 check trains the TensorFlow
worker's loop (``TfTrainer``) against the PyTorch worker's (``Trainer``) on the run the JAX port's
test trains (batch 16, 50 steps: the PyTorch side computed once per session and shared,
tests/frameworks/conftest.py); the float64 check trains the port itself against
``ResNetCIFAR`` with ``torch.optim.SGD`` (tests/frameworks/resnet_reference.py).

**Why two precisions.** In float32 the two trajectories part after a few steps, and not because
the port differs: a pre-activation within rounding of 0 switches its ReLU the other way (one such
element in the first backward pass of ResNet-20 moves a BatchNorm bias's gradient by 5%; measured
against float64), so each step's update differs by far more than an ulp and the next step's
switches differ more; the gap grows about tenfold per step at first. Measured on 4 seeds at
batch 32: step 0 agrees to 2e-7 relative (float32 rounding of the forward pass), step 1 to 2e-4
absolute, and then single losses differ by up to 0.17 by step 50 -- as much as PyTorch differs
from itself in float64 (0.15) or from itself with channels_last tensors (0.15). So the float32
test holds step 0 to ``rtol 1e-6``, step 1 to ``atol 1e-3``, every one of the 50 losses to
``atol 0.5`` and their mean to ``atol 0.05`` (measured at batch 32 at most 4.8e-7, 1.8e-4, 0.17
and 0.0093; at batch 16, the test's, 9.4e-8, 4.5e-5, 0.096 and 0.0042), which catches a wrong
model or a wrong rate but cannot see a subtle difference. That the reference learns within the
50 steps (so that a port that does not would show) is checked too: its mean loss over the last 10
steps is 0.19 below that over the first 10 at batch 16 (measured), held to at least 0.1.

The subtle ones (BatchNorm's momentum and its unbiased running variance, weight decay on every
parameter, Nesterov, torch.optim.SGD's momentum buffer) are seen in float64, where rounding is
1e-16 and the switches do not happen: the same port with ``dtype="float64"`` against the PyTorch
model in float64, 3 steps at batch 8 (the JAX port's float64 reference, shared), agree to 3e-14
of each tensor's largest value in the parameters, the running statistics and the test logits
after training (measured; at batch 32 over 50 steps they still agree to 1.3e-10). The test
holds the losses to 1e-12 and the tensors to 1e-11; measured against it, the biased running
variance is off by 6e-5 (1/(n - 1) = 2e-3 of a batch's variance in the last stage, n = 8 x 8 x 8),
a missing weight decay by 2e-7 in the losses, Nesterov left out by 5e-3 and a BatchNorm momentum
of 0.11 by 0.1: each fails it. Three steps show what five or fifty would: the first update
already carries every convention of the step, the third the momentum buffer's second use.

Then a real ``mlbench run task1a 2 --framework tensorflow`` (two processes under
MultiWorkerMirroredStrategy) of two steps, as the JAX port's test does: its result shows on
``status RUN`` with the framework, and each rank's loss equals that of its own half of the
global batch in one PyTorch process, at the first step and after the update from the two
workers' averaged gradients (the bounds of tests/frameworks/resnet_reference.py); its final
evaluation needed the BatchNorm statistics averaged over the processes (``sync_statistics``).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from mlbench.tasks.classification import learning_rate
from mlbench.tasks.datasets import load_splits
from mlbench.tasks.models import build_model
from mlbench.tasks.overrides import resolve
from mlbench.tasks.pipeline import Pipeline
from mlbench.tasks.task1a import TASK1A
from tests.frameworks.in_process import one_tensorflow_thread, train_tf_in_process, values
from tests.helpers import requires
from tests.frameworks.resnet_reference import (
    check_port_against_pytorch_events,
    FLOAT32_STEPS,
    FLOAT64_STEPS,
    check_a_real_two_worker_run,
    float32_config,
)

pytestmark = requires("tensorflow")


@pytest.fixture(scope="module", autouse=True)
def _tensorflow_on_one_thread() -> None:
    import tensorflow as tf

    one_tensorflow_thread(tf)

SEED = 0          # RunConfig's default
TEST_IMAGES = 200


@pytest.fixture(scope="module")
def one_thread():
    """One thread per framework, as a worker of a run has by default: the CPU-seconds of the test
    stay the work's, not two threads' spinning (TensorFlow's setting holds only before its first
    operation in this process; later it is left as it is)."""
    import tensorflow as tf

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass
    yield
    torch.set_num_threads(threads)


def assert_close_per_tensor(actual: dict, expected: dict, rtol: float) -> None:
    """Each tensor within ``rtol`` of its largest magnitude (a bias that starts at 0 has no scale
    of its own)."""
    for name, value in expected.items():
        scale = max(float(np.abs(value).max()), 1e-3)
        np.testing.assert_allclose(actual[name], value, rtol=0, atol=rtol * scale, err_msg=name)


@pytest.mark.parametrize("model, parameters", [("resnet20-v1", 272_474), ("resnet20-v2", 272_378)])
def test_the_port_starts_from_the_reference_weights_and_computes_its_logits(model, parameters, one_thread):
    from mlbench.tasks.task1a.tf_model import ResNetPort

    spec, _ = resolve(TASK1A, {"model": model})
    port = ResNetPort.from_reference(spec.settings, SEED)
    torch.manual_seed(SEED)
    reference = build_model(model).eval()
    state = {k: v.numpy() for k, v in reference.state_dict().items() if not k.endswith("num_batches_tracked")}
    converted = port.state_dict()
    assert list(converted) == list(state)   # and in its order
    for name, value in state.items():   # OIHW <-> HWIO and the transposed classifier, losslessly
        assert np.array_equal(converted[name], value), name
    assert port.num_parameters == parameters == sum(p.numel() for p in reference.parameters())
    assert np.array_equal(port.weights(), np.concatenate([p.detach().numpy().ravel() for p in reference.parameters()]))
    x = np.random.default_rng(0).normal(size=(4, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        expected = reference(torch.from_numpy(x)).numpy()
    # float32 sums of up to 576 products per convolution, 20 layers: measured 3e-6 on logits of ~10
    np.testing.assert_allclose(port.logits(x), expected, rtol=0, atol=3e-5)
    assert port.regulariser() == 0.0   # task 1a's l2 is 0: weight decay is the optimizer's


def test_batch_norm_keeps_pytorchs_unbiased_running_variance(one_thread):
    """PyTorch's rule, not Keras' (which takes the biased variance into the running one)."""
    import tensorflow as tf

    from mlbench.tasks.task1a.tf_model import BN_MOMENTUM, batch_norm_train, running_update

    x = np.random.default_rng(1).normal(2.0, 3.0, size=(2, 3, 1, 1)).astype(np.float32)   # n = 2 per channel
    bn = torch.nn.BatchNorm2d(3)
    expected = bn(torch.from_numpy(x)).detach().numpy()
    gamma, beta = tf.ones([3]), tf.zeros([3])
    out, mean, var = batch_norm_train(tf.constant(x.transpose(0, 2, 3, 1)), gamma, beta)
    np.testing.assert_allclose(out.numpy().transpose(0, 3, 1, 2), expected, rtol=0, atol=1e-5)
    running_mean, running_var = tf.Variable(tf.zeros([3])), tf.Variable(tf.ones([3]))
    running_update(running_mean, mean)
    running_update(running_var, var)
    assert bn.momentum == BN_MOMENTUM and bn.eps == 1e-5
    np.testing.assert_allclose(running_mean.numpy(), bn.running_mean.numpy(), rtol=1e-6)
    np.testing.assert_allclose(running_var.numpy(), bn.running_var.numpy(), rtol=1e-6)
    # n = 2: the unbiased variance is twice the biased one that normalises the batch
    np.testing.assert_allclose(running_var.numpy() - 0.9, 0.1 * 2 * x.var(axis=(0, 2, 3)), rtol=1e-5)


def test_the_first_50_float32_losses_of_the_tensorflow_resnet_follow_pytorchs(cifar_dir, pytorch_resnet_events,
                                                                               one_thread):
    """The TensorFlow worker's loop (``TfTrainer``, what ``mlbench run --framework tensorflow``
    runs) against the PyTorch worker's (``Trainer``) on the same run."""

    torch_events, tf_events = pytorch_resnet_events, train_tf_in_process(float32_config(cifar_dir))
    torch_losses, tf_losses = values(torch_events, "train/loss"), values(tf_events, "train/loss")
    assert len(tf_losses) == len(torch_losses) == FLOAT32_STEPS
    # tolerances: measured, and why they are this wide, in the module docstring
    np.testing.assert_allclose(tf_losses[0], torch_losses[0], rtol=1e-6)
    np.testing.assert_allclose(tf_losses[1], torch_losses[1], rtol=0, atol=1e-3)
    np.testing.assert_allclose(tf_losses, torch_losses, rtol=0, atol=0.5)
    assert abs(tf_losses.mean() - torch_losses.mean()) < 0.05
    assert torch_losses[-10:].mean() < torch_losses[:10].mean() - 0.1   # it did learn (docstring): the check has teeth
    check_port_against_pytorch_events(tf_events, torch_events)


def test_in_float64_the_tensorflow_resnet_trains_exactly_as_pytorchs(cifar_dir, pytorch_float64_resnet, one_thread):
    """Losses, parameters, running statistics and test logits after training (eval mode)."""
    from mlbench.tasks.task1a.tf_model import ResNetPort

    spec, (torch_losses, model, _, batches, spe) = pytorch_float64_resnet
    settings = spec.settings
    rates = [learning_rate(settings.lr, workers=1, batch_per_worker=settings.batch_per_worker, step=k,
                           steps_per_epoch=spe) for k in range(len(batches))]
    port = ResNetPort.from_reference(settings, SEED, dtype="float64")
    tf_losses = [port.step(x, y, lr) for (x, y), lr in zip(batches, rates)]
    assert len(tf_losses) == FLOAT64_STEPS
    np.testing.assert_allclose(tf_losses, torch_losses[:, 0], rtol=1e-12)
    expected = {k: v.numpy() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert_close_per_tensor(port.state_dict(), expected, 1e-11)
    train, test = load_splits(settings.dataset, "real", str(cifar_dir), SEED)
    test_x = Pipeline(train, test, torch.device("cpu"), images=True).test_batch(0, TEST_IMAGES)[0].numpy()
    with torch.no_grad():
        logits = copy.deepcopy(model).eval()(torch.from_numpy(test_x).double()).numpy()
    assert_close_per_tensor({"logits": port.logits(test_x)}, {"logits": logits}, 1e-11)


@pytest.mark.slow
def test_a_real_two_worker_tensorflow_run_of_task1a(cifar_small_dir):
    check_a_real_two_worker_run("tensorflow", cifar_small_dir)
