"""Train a tiny GPT-2 from scratch with the Hugging Face Trainer and a lowbit
optimizer (8-bit AdamW state) - no downloads: random init, a character-level
vocabulary and synthetic text.

    LOWBIT_LIBRARY=build/liblowbit.so PYTHONPATH=bindings python3 examples/hf_trainer_gpt2.py --steps 60

The optimizer and the lr schedule are handed to the Trainer with
``optimizers=(opt, sched)``; the Trainer clips the gradients
(``max_grad_norm``) and steps them as it would step torch.optim.AdamW.
Prints the training loss as it goes and, at the end, the first and last
logged losses.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def synthetic_text(n_lines: int, seed: int) -> list[str]:
    """Sentences from a small grammar: learnable structure, no download."""
    g = torch.Generator().manual_seed(seed)
    subjects = ["the cat", "a dog", "the bird", "my friend", "the teacher", "a robot"]
    verbs = ["sees", "likes", "finds", "follows", "paints", "builds"]
    objects = ["the ball", "a house", "the river", "some bread", "a small box", "the moon"]
    lines = []
    for _ in range(n_lines):
        s, v, o = (int(torch.randint(len(x), (1,), generator=g)) for x in (subjects, verbs, objects))
        lines.append(f"{subjects[s]} {verbs[v]} {objects[o]}.")
    return lines


class CharDataset(torch.utils.data.Dataset):
    """Fixed-length blocks of character ids; labels = inputs (the model shifts)."""

    def __init__(self, text: str, vocab: dict, block: int):
        ids = torch.tensor([vocab[c] for c in text], dtype=torch.long)
        n = (len(ids) - 1) // block
        self.blocks = ids[: n * block].view(n, block)

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        x = self.blocks[i]
        return {"input_ids": x, "labels": x.clone(), "attention_mask": torch.ones_like(x)}


def build(args):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, get_cosine_schedule_with_warmup

    import lowbit.torch as lt

    torch.manual_seed(args.seed)
    text = " ".join(synthetic_text(2000, args.seed))
    vocab = {c: i for i, c in enumerate(sorted(set(text)))}
    data = CharDataset(text, vocab, args.block)

    config = GPT2Config(vocab_size=len(vocab), n_positions=args.block, n_embd=64, n_layer=2, n_head=4,
                        n_inner=128, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=vocab["."], eos_token_id=vocab["."])
    model = GPT2LMHeadModel(config)  # random init

    opt = lt.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, state=args.state, min_quantized_numel=1024)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=args.steps // 10, num_training_steps=args.steps)

    targs = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        logging_steps=args.log_every,
        max_grad_norm=1.0,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        seed=args.seed,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=data, optimizers=(opt, sched))
    return trainer, opt, sched


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--state", default="8bit", help="lowbit state format: fp32, bf16, 8bit, 4bit, fp8")
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-dir", default="hf_trainer_gpt2_out")
    ap.add_argument("--json", action="store_true", help="print the logged losses as one JSON line at the end")
    args = ap.parse_args(argv)

    trainer, opt, _ = build(args)
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    formats = sorted({opt.param_info(p).state_format for p in opt.param_groups[0]["params"] if p in opt.state})
    if args.json:
        print(json.dumps({"losses": losses, "formats": formats, "state_bytes": opt.state_bytes(),
                          "steps": trainer.state.global_step}))
    else:
        print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {trainer.state.global_step} steps; "
              f"lowbit state formats {formats}, {opt.state_bytes() / 1e6:.2f} MB of optimizer state")
    return losses


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
