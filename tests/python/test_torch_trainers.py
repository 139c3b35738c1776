"""The trainers' own routes to a lowbit optimizer, without glue:

* Hugging Face ``Trainer(optimizer_cls_and_kwargs=(lowbit.torch.AdamW, {...}))``:
  the Trainer builds the optimizer (its weight-decay groups), trains, and a
  run resumed from its checkpoint takes the same next steps, bit for bit, as
  the uninterrupted run;
* Accelerate's ``prepare``: the prepared optimizer steps as the plain loop
  does, bit for bit, and ``save_state`` / ``load_state`` resume it;
* PyTorch Lightning's ``configure_optimizers`` (when Lightning is installed):
  ``Trainer.fit`` equals the plain loop, bit for bit."""

import pytest

torch = pytest.importorskip("torch")
import lowbit.torch as lt  # noqa: E402


def _mlp(seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m


def _data(seed, n=64):
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def _plain_loop(seed, steps, batch=8, kwargs=None):
    model = _mlp(seed)
    opt = lt.AdamW(model.parameters(), **(kwargs or dict(lr=1e-2, state="8bit", min_quantized_numel=0)))
    x, y = _data(seed)
    for s in range(steps):
        xb, yb = x[s * batch % len(x):][:batch], y[s * batch % len(y):][:batch]
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        opt.zero_grad()
    return model


# ---- Hugging Face Trainer

class _HFModel(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        self.net = _mlp(seed)

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


class _Rows(torch.utils.data.Dataset):
    def __init__(self, seed):
        self.x, self.y = _data(seed)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def _hf_trainer(seed, out, max_steps, save_steps=None):
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=8, learning_rate=1e-2,
        weight_decay=0.01, lr_scheduler_type="cosine", warmup_steps=2, logging_steps=1, report_to=[],
        use_cpu=True, dataloader_num_workers=0, seed=seed, disable_tqdm=True,
        save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500)
    return transformers.Trainer(model=_HFModel(seed), args=args, train_dataset=_Rows(seed),
                                optimizer_cls_and_kwargs=(lt.AdamW, {"state": "8bit", "min_quantized_numel": 0}))


def test_hf_trainer_builds_the_lowbit_optimizer_and_resumes_bit_for_bit(tmp_path, seed):
    rng = torch.get_rng_state()
    try:
        straight = _hf_trainer(seed, tmp_path / "a", 8)
        straight.train()
        assert isinstance(straight.optimizer.optimizer if hasattr(straight.optimizer, "optimizer")
                          else straight.optimizer, lt.AdamW)
        first = _hf_trainer(seed, tmp_path / "b", 8, save_steps=5)
        first.train()
        resumed = _hf_trainer(seed, tmp_path / "b", 8, save_steps=5)
        resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-5"))
    finally:
        torch.set_rng_state(rng)
    losses = [e["loss"] for e in straight.state.log_history if "loss" in e]
    assert len(losses) == 8
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    opt = resumed.optimizer.optimizer if hasattr(resumed.optimizer, "optimizer") else resumed.optimizer
    assert {opt.param_info(p).step for g in opt.param_groups for p in g["params"]} == {8}


# ---- Accelerate

def test_accelerate_prepare_steps_as_the_plain_loop_and_resumes(tmp_path, seed):
    accelerate = pytest.importorskip("accelerate")
    want = _plain_loop(seed, 6)
    acc = accelerate.Accelerator(cpu=True)
    model = _mlp(seed)
    opt = lt.AdamW(model.parameters(), lr=1e-2, state="8bit", min_quantized_numel=0)
    x, y = _data(seed)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=False)
    model, opt, loader = acc.prepare(model, opt, loader)
    batches = list(loader)
    for s in range(6):
        if s == 3:
            acc.save_state(str(tmp_path / "state"))
        xb, yb = batches[s % len(batches)]
        acc.backward(torch.nn.functional.cross_entropy(model(xb), yb))
        opt.step()
        opt.zero_grad()
    for a, b in zip(want.parameters(), model.parameters()):
        assert torch.equal(a, b)
    # load_state restores the optimizer of step 3: three more steps land on the same params
    acc.load_state(str(tmp_path / "state"))
    for s in range(3, 6):
        xb, yb = batches[s % len(batches)]
        acc.backward(torch.nn.functional.cross_entropy(model(xb), yb))
        opt.step()
        opt.zero_grad()
    for a, b in zip(want.parameters(), model.parameters()):
        assert torch.equal(a, b)


# ---- PyTorch Lightning

def test_lightning_configure_optimizers_equals_the_plain_loop(tmp_path, seed):
    pl = pytest.importorskip("lightning.pytorch")

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _mlp(seed)

        def training_step(self, batch, _):
            xb, yb = batch
            return torch.nn.functional.cross_entropy(self.net(xb), yb)

        def configure_optimizers(self):
            return lt.AdamW(self.parameters(), lr=1e-2, state="8bit", min_quantized_numel=0)

    x, y = _data(seed)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=False)
    module = Module()
    trainer = pl.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.fit(module, loader)
    want = _plain_loop(seed, 6)
    for a, b in zip(want.parameters(), module.net.parameters()):
        assert torch.equal(a, b)
