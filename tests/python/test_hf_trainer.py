"""The Hugging Face Trainer with a lowbit optimizer and lr scheduler
(``optimizers=(opt, sched)``): examples/hf_trainer_gpt2.py trains a tiny
random-init GPT-2 on synthetic text for a few steps on the CPU; the loss
decreases, the state is 8-bit where the tensors are large enough, every
param took every step, and the scheduler's last lr is the one the library
holds."""

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
try:
    import transformers  # noqa: F401
    import accelerate  # noqa: F401
except ImportError as e:  # scripts/requirements-test.txt installs both
    pytest.skip(f"transformers / accelerate cannot be imported ({e}); pip install transformers accelerate",
                allow_module_level=True)

import seeding  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_trainer_gpt2.py"
STEPS = 24


def _example():
    spec = importlib.util.spec_from_file_location("hf_trainer_gpt2", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("hf_trainer_gpt2", mod)
    spec.loader.exec_module(mod)
    return mod


def test_trainer_with_lowbit_adamw_reduces_the_loss(tmp_path):
    ex = _example()
    args = ex.argparse.Namespace(steps=STEPS, batch=8, block=64, lr=3e-3, state="8bit", log_every=4,
                                 seed=seeding.derive("hf_trainer") % 2**31, output_dir=str(tmp_path))
    rng_state = torch.get_rng_state()
    try:
        trainer, opt, sched = ex.build(args)
        trainer.train()
    finally:
        torch.set_rng_state(rng_state)  # Trainer seeds the global generator
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert trainer.state.global_step == STEPS and len(losses) == STEPS // 4
    # A character model at random init starts near log(vocab) ~ 3.2 nats and
    # learns the letter frequencies within a few steps.
    assert losses[-1] < 0.85 * losses[0], losses
    params = [p for p in opt.param_groups[0]["params"] if p.requires_grad]
    assert {opt.param_info(p).step for p in params} == {STEPS}
    assert "8bit" in {opt.param_info(p).state_format for p in params}
    lr = sched.get_last_lr()[0]
    assert opt.param_groups[0]["lr"] == pytest.approx(lr)
    # the lr of the last step reached the library (the scheduler has moved on by one since)
    held = opt.lowbit_handles()["cpu"].get_hparams(0)["lr"]
    assert held == pytest.approx(sched.lr_lambdas[0](STEPS - 1) * args.lr, rel=1e-6)
