"""The TensorFlow ResNet of task 1a (mlbench/worker/tf_resnet.py) trains as mlbench's PyTorch ResNet.

Both start from the weights mlbench's reference draws (``ResNetPort.from_reference``) and train
on the same arrays: real CIFAR-10 images (the suite's subset), the task's sample order
(``epoch_batches``), augmented and normalised by mlbench's own pipeline, with the task's rate
rule, Nesterov momentum 0.9 and weight decay 1e-4, batch 32; the PyTorch reference is
``ResNetCIFAR`` with ``torch.optim.SGD``.

**Why two precisions.** In float32 the two trajectories part after a few steps, and not because
the port differs: a pre-activation within rounding of 0 switches its ReLU the other way (one such
element in the first backward pass of ResNet-20 moves a BatchNorm bias's gradient by 5%; measured
against float64), so each step's update differs by far more than an ulp and the next step's
switches differ more; the gap grows about tenfold per step at first. Measured on 4 seeds: step 0
agrees to 2e-7 relative (float32 rounding of the forward pass), step 1 to 2e-4 absolute, and
then single losses differ by up to 0.17 by step 50 -- as much as PyTorch differs from itself in
float64 (0.15) or from itself with channels_last tensors (0.15). So the float32 test holds step 0
to ``rtol 1e-6``, step 1 to ``atol 1e-3``, every one of the 50 losses to ``atol 0.5`` and their mean
to ``atol 0.05`` (measured at most 4.8e-7, 1.8e-4, 0.17 and 0.0093: 2 to 5 times above), which
catches a wrong model or a wrong rate but cannot see a subtle difference.

The subtle ones (BatchNorm's momentum and its unbiased running variance, weight decay on every
parameter, Nesterov, torch.optim.SGD's momentum buffer) are seen in float64, where rounding is
1e-16 and the switches do not happen: the same port with ``dtype="float64"`` against the PyTorch
model in float64, 5 steps (float64 convolutions cost about 1 CPU-s a step in each framework),
agree to 3.2e-14 relative in the losses and to 1.8e-12 of each tensor's largest value in the
parameters, the running statistics and the test logits after training (measured; over 50 steps
they still agree to 1.3e-10). The test holds the losses to 1e-12 and the tensors to 1e-11, while
the biased running variance would be off by 1/(n - 1) = 5e-4 in the last stage and a missing
weight decay by lr * 1e-4 = 1e-6 of a weight per step.

Then a real ``mlbench run task1a 2 --framework tensorflow`` (two processes under
MultiWorkerMirroredStrategy) of two steps, as the JAX port's test does: its result shows on
``status RUN`` with the framework, and each rank's loss equals that of its own half of the
global batch in one PyTorch process, at the first step and after the update from the two
workers' averaged gradients (the bounds of tests/frameworks/resnet_reference.py); its final
evaluation needed the BatchNorm statistics averaged over the processes (``sync_statistics``).
"""

from __future__ import annotations

import numpy as np
import pytest

# torchvision (and with it torch._dynamo and triton) before TensorFlow: in the other order, loading
# triton's LLVM after TensorFlow's crashes the process (see test_tf_port.py)
import torchvision  # noqa: F401

pytest.importorskip("tensorflow")

import torch

from mlbench.tasks.classification import learning_rate
from mlbench.tasks.data.sharding import epoch_batches, steps_per_epoch
from mlbench.tasks.datasets import load_splits
from mlbench.tasks.models import build_model
from mlbench.tasks.overrides import resolve
from mlbench.tasks.pipeline import Pipeline
from mlbench.tasks.task1a import TASK1A

SEED = 0          # RunConfig's default
STEPS = 50
STEPS_FLOAT64 = 5
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


@pytest.fixture(scope="module")
def data(cifar_dir, one_thread):
    """The task's settings, the first STEPS minibatches of epoch 0 as mlbench's pipeline makes
    them (NCHW float32, augmented), their rates, and normalised test images."""
    spec, _ = resolve(TASK1A, {})
    settings = spec.settings
    train, test = load_splits(settings.dataset, "real", str(cifar_dir), SEED)
    pipe = Pipeline(train, test, torch.device("cpu"), images=True)
    pipe.begin_epoch(SEED, 0)
    batch = settings.batch_per_worker
    per_epoch = steps_per_epoch(pipe.num_train, 1, batch)
    order = epoch_batches(pipe.num_train, workers=1, rank=0, batch_per_worker=batch, seed=SEED, epoch=0)
    batches = [tuple(t.numpy() for t in pipe.train_batch(idx)) for idx in order[:STEPS]]
    rates = [learning_rate(settings.lr, workers=1, batch_per_worker=batch, step=k, steps_per_epoch=per_epoch)
             for k in range(STEPS)]
    return settings, batches, rates, pipe.test_batch(0, TEST_IMAGES)[0].numpy()


def train_torch(settings, batches, rates, dtype):
    """mlbench's ResNet from the seed, trained by torch.optim.SGD with the task's settings."""
    torch.manual_seed(SEED)
    model = build_model(settings.model).to(dtype)
    sgd = torch.optim.SGD(model.parameters(), lr=0.0, momentum=settings.momentum, nesterov=settings.nesterov,
                          weight_decay=settings.weight_decay)
    losses = []
    for (x, y), lr in zip(batches, rates):
        for group in sgd.param_groups:
            group["lr"] = lr
        sgd.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x).to(dtype)), torch.from_numpy(y))
        loss.backward()
        sgd.step()
        losses.append(loss.item())
    return np.array(losses), model.eval()


def train_tf(settings, batches, rates, dtype):
    from mlbench.worker.tf_resnet import ResNetPort

    port = ResNetPort.from_reference(settings, SEED, dtype=dtype)
    return np.array([port.step(x, y, lr) for (x, y), lr in zip(batches, rates)]), port


def assert_close_per_tensor(actual: dict, expected: dict, rtol: float) -> None:
    """Each tensor within ``rtol`` of its largest magnitude (a bias that starts at 0 has no scale
    of its own)."""
    for name, value in expected.items():
        scale = max(float(np.abs(value).max()), 1e-3)
        np.testing.assert_allclose(actual[name], value, rtol=0, atol=rtol * scale, err_msg=name)


@pytest.mark.parametrize("model, parameters", [("resnet20-v1", 272_474), ("resnet20-v2", 272_378)])
def test_the_port_starts_from_the_reference_weights_and_computes_its_logits(model, parameters, one_thread):
    from mlbench.worker.tf_resnet import ResNetPort

    spec, _ = resolve(TASK1A, {"model": model})
    port = ResNetPort.from_reference(spec.settings, SEED)
    torch.manual_seed(SEED)
    reference = build_model(model).eval()
    state = {k: v.numpy() for k, v in reference.state_dict().items() if not k.endswith("num_batches_tracked")}
    converted = port.state_dict()
    assert converted.keys() == state.keys()
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

    from mlbench.worker.tf_resnet import BN_MOMENTUM, batch_norm_train, running_update

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


def test_the_first_50_float32_losses_of_the_tensorflow_resnet_follow_pytorchs(data):
    settings, batches, rates, _ = data
    torch_losses, _ = train_torch(settings, batches, rates, torch.float32)
    tf_losses, port = train_tf(settings, batches, rates, "float32")
    assert len(tf_losses) == len(torch_losses) == STEPS
    # tolerances: measured, and why they are this wide, in the module docstring
    np.testing.assert_allclose(tf_losses[0], torch_losses[0], rtol=1e-6)
    np.testing.assert_allclose(tf_losses[1], torch_losses[1], rtol=0, atol=1e-3)
    np.testing.assert_allclose(tf_losses, torch_losses, rtol=0, atol=0.5)
    assert abs(tf_losses.mean() - torch_losses.mean()) < 0.05
    assert torch_losses[-10:].mean() < torch_losses[:10].mean() - 0.2   # it did learn: the check has teeth
    assert np.isfinite(port.weights()).all()


def test_in_float64_the_tensorflow_resnet_trains_exactly_as_pytorchs(data):
    """Losses, parameters, running statistics and test logits after training (eval mode)."""
    settings, batches, rates, test_x = data
    batches, rates = batches[:STEPS_FLOAT64], rates[:STEPS_FLOAT64]
    torch_losses, model = train_torch(settings, batches, rates, torch.float64)
    tf_losses, port = train_tf(settings, batches, rates, "float64")
    np.testing.assert_allclose(tf_losses, torch_losses, rtol=1e-12)
    expected = {k: v.numpy() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert_close_per_tensor(port.state_dict(), expected, 1e-11)
    with torch.no_grad():
        logits = model(torch.from_numpy(test_x).double()).numpy()
    assert_close_per_tensor({"logits": port.logits(test_x)}, {"logits": logits}, 1e-11)


@pytest.mark.slow
def test_a_real_two_worker_tensorflow_run_of_task1a(cifar_dir):
    from tests.frameworks.resnet_reference import check_a_real_two_worker_run

    check_a_real_two_worker_run("tensorflow", cifar_dir)
