"""Build the testbed's trained tiny model (issue 58 item 1): the tiny Llama's shape (build_tiny_model.py),
trained for a few minutes on the CPU on text the engine image holds, so that its greedy answers are
confident, as a real model's are, unlike the random-weight model's near-flat logits (any numeric change
flips those). The canary's tolerance across an image change is measured on it
(perf/canary_agreement_tiny.py).

The text: the Python standard library's own source files in the image (the interpreter's `*.py`,
sorted by name), the first TRAIN_CHARS of it for training; the tokenizer (byte-level BPE, 2048 tokens)
is trained on the same text. Training: AdamW, a cosine schedule from LR, STEPS steps of BATCH random
windows of SEQ tokens, fp32 on the CPU, fixed seeds; saved in bf16 as the tiny model is. Beside the model,
`training.json` says what it was trained on and its last loss. Deterministic up to the CPU's own
floating-point order (the testbed caches it by this script's hash, so it is trained once per machine).

Runs inside the testbed's base image, beside build_tiny_model.py: `python3 train_tiny_model.py OUT_DIR`.
"""

from __future__ import annotations

import glob
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_tiny_model as tiny  # noqa: E402

TRAIN_CHARS = 400_000
STEPS, BATCH, SEQ, LR = 2400, 16, 128, 3e-3


def stdlib_text() -> str:
    """The interpreter's own standard library source, every top-level module, sorted by name."""
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
    return "".join(Path(f).read_text(encoding="utf-8", errors="replace") for f in files)


def build(out: Path) -> dict:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    text = stdlib_text()[:TRAIN_CHARS]
    fast = tiny.tokenizer([text])
    ids = torch.tensor(fast(text)["input_ids"], dtype=torch.long)
    model = LlamaForCausalLM(tiny.config(fast))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    gen = torch.Generator().manual_seed(0)
    t0, losses = time.monotonic(), []
    for step in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = LR * 0.5 * (1 + math.cos(math.pi * step / STEPS))
        starts = torch.randint(0, len(ids) - SEQ - 1, (BATCH,), generator=gen)
        x = torch.stack([ids[s : s + SEQ] for s in starts.tolist()])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    secs = time.monotonic() - t0
    tiny.save(model.eval(), fast, out)
    facts = {
        "text": f"the first {TRAIN_CHARS} characters of Python {sys.version.split()[0]}'s standard library (*.py)",
        "tokens": len(ids),
        "steps": STEPS,
        "batch": BATCH,
        "seq": SEQ,
        "lr": LR,
        "threads": torch.get_num_threads(),
        "train_s": round(secs, 1),
        "loss_first": round(losses[0], 3),
        "loss_last_100": round(sum(losses[-100:]) / 100, 3),
    }
    (out / "training.json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]))), flush=True)
