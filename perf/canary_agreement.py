"""How far a confident model's greedy answers agree across numeric changes (issue 58 item 1): the
measurement behind `node/canary.IMAGE_CHANGE_AGREEMENT`, run on the GPU machine the project borrows.

Not part of `make bench` (it needs a GPU and PyTorch; the testbed has neither, and its model's random
weights flip greedy tokens at any numeric change). It trains a small byte-level transformer (6 layers,
width 512, context 256) for TS seconds (default 240) on the text the machine has locally (the source
files of the Python standard library), which makes it confident on held-out source; then asks it 200
held-out 64-byte prompts for 16 greedy tokens in float32 (TF32 off) and again under changes that move
numerics only, as another image's kernels do (bf16 and fp16 autocast, TF32 matmuls, a batch of 8
instead of 1), and under changes that damage the model (Gaussian noise of 3, 10, 30% of each tensor's
spread on every weight). For each it prints, over the prompts, the share of answers repeated exactly,
and the minimum, 5th and 10th percentile and mean of the common-prefix agreement (`canary.Answer.
agreement`: the share of the 16 tokens, from the first, that repeat), with the model's mean top-1
probability on its own greedy tokens (how confident it is).

The command sent to the machine was this code as of commit 3649c30 (torch then imported at the top;
its docstring and blank lines left out, its indentation shortened), gzipped and base64-encoded into
one line, the tool taking 2,000 characters; TS was the default, 240. The results are in
docs/guides/upgrade.md ("What the canary asks of a new image").
"""

import copy
import glob
import json
import os
import random
import time

DEV = "cuda"
PROMPT, TOKENS = 64, 16


def model_class():
    import torch  # only on the GPU machine: `make bench` and the unit tests import this module without it

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.e, self.p = torch.nn.Embedding(256, 512), torch.nn.Embedding(256, 512)
            layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, 0, batch_first=True, norm_first=True)
            self.b, self.o = torch.nn.TransformerEncoder(layer, 6), torch.nn.Linear(512, 256)

        def forward(self, x):
            n = x.shape[1]
            mask = torch.nn.Transformer.generate_square_subsequent_mask(n, device=x.device)
            return self.o(self.b(self.e(x) + self.p(torch.arange(n, device=x.device)), mask=mask, is_causal=True))

    return Model


def main() -> None:
    import torch

    F = torch.nn.functional
    Model = model_class()
    torch.manual_seed(0)
    random.seed(0)
    text = b"".join(open(f, "rb").read() for f in sorted(glob.glob(os.path.dirname(os.__file__) + "/*.py")))
    data = torch.tensor(list(text), dtype=torch.long)
    train, held = data[: int(len(data) * 0.95)], data[int(len(data) * 0.95) :]
    m = Model().to(DEV)
    opt = torch.optim.AdamW(m.parameters(), 6e-4)
    t0, steps = time.time(), 0
    while time.time() - t0 < float(os.environ.get("TS", "240")):
        i = torch.randint(0, len(train) - 257, (64,))
        x = torch.stack([train[j : j + 257] for j in i]).to(DEV)
        with torch.autocast(DEV, torch.bfloat16):
            loss = F.cross_entropy(m(x[:, :-1]).reshape(-1, 256).float(), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    m.eval()
    print("steps", steps, "loss", loss.item())
    prompts = [held[j : j + PROMPT] for j in random.sample(range(len(held) - 100), 200)]

    def generate(model, dtype=None, batch=1):
        out = []
        for c in range(0, len(prompts), batch):
            x, probs = torch.stack(prompts[c : c + batch]).to(DEV), []
            for _ in range(TOKENS):
                with torch.no_grad(), torch.autocast(DEV, dtype, enabled=dtype is not None):
                    z = model(x)[:, -1].float().softmax(-1)
                probs.append(z.max(-1).values)
                x = torch.cat([x, z.argmax(-1, keepdim=True)], 1)
            out += list(zip(x[:, PROMPT:].tolist(), torch.stack(probs, 1).mean(1).tolist(), strict=True))
        return out

    def agreement(a, b):
        k = 0
        while k < TOKENS and a[k] == b[k]:
            k += 1
        return k / TOKENS

    torch.backends.cuda.matmul.allow_tf32 = False
    ref = generate(m)
    result = {"confidence": sum(c for _, c in ref) / len(ref)}

    def compare(name, got):
        v = sorted(agreement(a[0], b[0]) for a, b in zip(ref, got, strict=True))
        result[name] = {
            "same": sum(x == 1 for x in v) / len(v),
            "min": v[0],
            "p5": v[len(v) // 20],
            "p10": v[len(v) // 10],
            "mean": sum(v) / len(v),
        }

    compare("bf16", generate(m, torch.bfloat16))
    compare("fp16", generate(m, torch.float16))
    compare("batch8_fp32", generate(m, None, 8))
    torch.backends.cuda.matmul.allow_tf32 = True
    compare("tf32", generate(m))
    for e in (0.03, 0.1, 0.3):
        broken = copy.deepcopy(m)
        with torch.no_grad():
            for q in broken.parameters():
                q.add_(torch.randn_like(q) * q.std() * e)
        compare(f"noise{e:g}", generate(broken))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
