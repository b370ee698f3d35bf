"""The prepared SPEED-Bench subset made from the hub's copy (sparkcluster/bench/prompts: the rule and its
sources), in the head container with its python (vLLM's, which has huggingface_hub). It reads JSON Lines
files only: the hub's own copy is Parquet, which needs pyarrow, a package no source says a vLLM image
carries, so a Parquet file is a reason given, not read. argv: the subset, the dataset repository, the
hub's placeholder text, the prepared folder's name in the HF cache. HF_ENDPOINT names the hub. Prints
`speed_bench_path=<folder>` once `<folder>/<subset>.jsonl` is written, else `speed_bench_error=<why>`;
exits 0 either way."""

import json
import os
import sys


def out(key, value):
    print(key + "=" + " ".join(str(value).split())[:400])
    sys.exit(0)


def rows_of(root, subset, repo):
    """Every row of the subset's JSON Lines files; a Parquet file stops it, saying so."""
    rows = []
    for d, _, names in sorted(os.walk(os.path.join(root, subset))):
        for n in sorted(names):
            p = os.path.join(d, n)
            if n.endswith(".parquet"):
                out("speed_bench_error", f"{repo}'s {subset}/{n} is Parquet, which this reader does not read")
            if n.endswith((".jsonl", ".json")):
                with open(p, encoding="utf-8") as fh:
                    rows += [json.loads(x) for x in fh if x.strip()]
    return rows


def main(argv):
    subset, repo, placeholder, prepared = argv[1:5]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    dest = os.path.join(home, prepared)
    try:
        from huggingface_hub import snapshot_download

        root = snapshot_download(repo_id=repo, repo_type="dataset", allow_patterns=[subset + "/*"])
    except Exception as e:  # noqa: BLE001 - whatever the hub or the client said is the reason given
        hub = os.environ.get("HF_ENDPOINT") or "the public hub"
        out("speed_bench_error", f"{repo} from {hub}: {type(e).__name__}: {e}")
    rows = rows_of(root, subset, repo)
    if not rows:
        out("speed_bench_error", f"{repo} has no rows under {subset}/")
    held = sum(1 for r in rows if any(placeholder in str(t) for t in (r.get("turns") or [])))
    if held:
        why = "the hub's placeholder for data it may not redistribute"
        out("speed_bench_error", f"{held} of {len(rows)} rows of {repo}'s {subset} are {why}")
    os.makedirs(dest, exist_ok=True)
    tmp = os.path.join(dest, f".{subset}.jsonl.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    os.replace(tmp, os.path.join(dest, subset + ".jsonl"))
    out("speed_bench_path", dest)


if __name__ == "__main__":
    main(sys.argv)
