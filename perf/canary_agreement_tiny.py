"""How far the testbed's trained tiny model's greedy answers agree across numeric changes (issue 58
item 1): the canary's tolerance across an image change (`node/canary.IMAGE_CHANGE_AGREEMENT`) measured
on the model the testbed keeps (tests/testbed/model/train_tiny_model.py), on the testbed's own CPU.

`python -m perf.canary_agreement_tiny [OUT.json]` from a checkout with the testbed up (it builds the
trained model once, cached like the tiny model): runs THIS file inside the testbed's base image (the
NGC name standing for the real vLLM CPU build, which has torch and transformers) on the head, with the
model and the checkout's `sparkcluster` mounted read-only, and prints the table (markdown) and writes
the figures (JSON, default perf/canary_agreement_tiny.json).

Inside the image (`--inside MODEL_DIR`): two sets of PROMPTS prompts of PROMPT_TOKENS tokens, cut from
the standard library text the model was not trained on ("held out") and from the text it was trained
on ("seen", as a real model knows the canary's own prompts), each asked for MAX_TOKENS greedy tokens
(the canary's own 16) in float32 as the reference, then again under changes that move numerics only, as another image's
kernels do (the model run in bf16, as vLLM serves it from its config; bf16 autocast over fp32 weights;
a batch of 8 left-padded prompts instead of one; another thread count), and under changes that damage
it (Gaussian noise of 3, 10, 30% of each tensor's spread on every weight). For each, over the prompts:
the share of answers repeated exactly, the minimum, 5th and 10th percentiles and mean of the canary's
own agreement (`canary.Answer.agreement`: the share of the 16 tokens, from the first, that repeat), and
the share of answers the canary would refuse (agreement below IMAGE_CHANGE_AGREEMENT); with the
model's mean top-1 probability on its own greedy tokens (how confident it is).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

PROMPTS, PROMPT_TOKENS, BATCH = 120, 32, 8
ROOT = Path(__file__).resolve().parent.parent


def inside(model_dir: Path) -> dict:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    sys.path.insert(0, "/sc")
    from sparkcluster.node.canary import IMAGE_CHANGE_AGREEMENT, MAX_TOKENS, Answer

    sys.path.insert(0, "/model-src")
    import train_tiny_model as trained

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = trained.stdlib_text()

    def cut(part: str) -> list[list[int]]:
        ids = tok(part)["input_ids"]
        step = max(1, (len(ids) - PROMPT_TOKENS) // PROMPTS)
        return [ids[i * step : i * step + PROMPT_TOKENS] for i in range(PROMPTS)]

    # held out: text it never saw; seen: text it was trained on, as a real model knows the canary's
    # prompts ("The capital of France is")
    sets = {"held out": cut(text[trained.TRAIN_CHARS :]), "seen": cut(text[: trained.TRAIN_CHARS])}
    prompts: list[list[int]] = []

    def load(dtype):
        return LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=dtype).eval()

    @torch.no_grad()
    def greedy(model, batch: int = 1, autocast: bool = False) -> tuple[list[tuple[int, ...]], float]:
        out, conf = [], []
        for i in range(0, len(prompts), batch):
            group = prompts[i : i + batch]
            width = max(len(p) for p in group)
            x = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in group])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                got = model.generate(
                    input_ids=x,
                    attention_mask=mask,
                    max_new_tokens=MAX_TOKENS,
                    min_new_tokens=MAX_TOKENS,
                    do_sample=False,
                    output_scores=True,
                    return_dict_in_generate=True,
                    pad_token_id=tok.pad_token_id,
                )
            probs = torch.stack([s.float().softmax(-1).max(-1).values for s in got.scores], 1)
            conf += probs.mean(1).tolist()
            out += [tuple(r[width:].tolist()) for r in got.sequences]
        return out, sum(conf) / len(conf)

    def noisy(share: float):
        m = load(torch.float32)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn(p.shape, generator=g) * p.std() * share)
        return m

    threads = torch.get_num_threads()

    def one_thread(fn):
        torch.set_num_threads(1)
        try:
            return fn()
        finally:
            torch.set_num_threads(threads)

    ref_model = load(torch.float32)
    changes = {
        "bf16 weights": ("another image's kernels (numerics only)", lambda: greedy(load(torch.bfloat16))),
        "bf16 autocast": ("the same", lambda: greedy(ref_model, autocast=True)),
        "batch of 8": ("batching", lambda: greedy(ref_model, batch=BATCH)),
        "one thread": ("another thread count", lambda: one_thread(lambda: greedy(ref_model))),
        "weights + 3% noise": ("a damaged model", lambda: greedy(noisy(0.03))),
        "weights + 10% noise": ("a broken one", lambda: greedy(noisy(0.10))),
        "weights + 30% noise": ("a wrecked one", lambda: greedy(noisy(0.30))),
    }
    by_set = {}
    for label, chosen in sets.items():
        prompts[:] = chosen
        ref, confidence = greedy(ref_model)
        rows = {}
        for name, (what, run) in changes.items():
            t0 = time.monotonic()
            got, _ = run()
            pairs = list(zip(ref, got, strict=True))
            agree = sorted(Answer("", "", a).agreement(Answer("", "", b)) for a, b in pairs)
            n = len(agree)
            rows[name] = {
                "what": what,
                "exact": sum(a == b for a, b in pairs) / n,
                "min": agree[0],
                "p5": agree[int(0.05 * n)],
                "p10": agree[int(0.10 * n)],
                "mean": sum(agree) / n,
                "refused": sum(a < IMAGE_CHANGE_AGREEMENT for a in agree) / n,
                "secs": round(time.monotonic() - t0, 1),
            }
        by_set[label] = {"confidence": confidence, "changes": rows}
    training = json.loads((model_dir / "training.json").read_text())
    return {
        "prompts": PROMPTS,
        "prompt_tokens": PROMPT_TOKENS,
        "max_tokens": MAX_TOKENS,
        "threshold": IMAGE_CHANGE_AGREEMENT,
        "torch": torch.__version__,
        "threads": threads,
        "training": training,
        "sets": by_set,
    }


def table(res: dict) -> str:
    t = res["training"]
    out = [
        f"{res['prompts']} prompts of {res['prompt_tokens']} tokens per set, {res['max_tokens']} greedy tokens each, "
        f"threshold {res['threshold']:.2f}; the model trained {t['steps']} steps ({t['train_s']:.0f} s on "
        f"{t['threads']} threads), last loss {t['loss_last_100']:.2f}.",
    ]
    for label, got in res["sets"].items():
        out += [
            "",
            f"Prompts {label}: mean top-1 probability on its own greedy tokens {got['confidence']:.2f}.",
            "",
            "| change | what it stands for | answers repeated exactly | min | 5th pct | 10th pct | mean | refused |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, r in got["changes"].items():
            out.append(
                f"| {name} | {r['what']} | {r['exact']:.1%} | {r['min']:.2f} | {r['p5']:.2f} | {r['p10']:.2f} "
                f"| {r['mean']:.3f} | {r['refused']:.1%} |"
            )
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--inside"]:
        print(json.dumps(inside(Path(argv[1]))), flush=True)
        return 0
    from perf import testbed

    out = Path(argv[0]) if argv else ROOT / "perf" / "canary_agreement_tiny.json"
    tb = testbed.connect()
    model = testbed.trained_model(tb)
    mounts = {model: "/model", ROOT / "sparkcluster": "/sc/sparkcluster", testbed.TRAINING_SCRIPTS: "/model-src"}
    mounts[Path(__file__).resolve()] = "/measure.py"
    stdout = testbed.in_engine_image(tb, mounts, "python3 /measure.py --inside /model", timeout=1800)
    res = json.loads(stdout.strip().splitlines()[-1])
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(table(res), end="")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
