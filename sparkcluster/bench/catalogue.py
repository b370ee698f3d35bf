"""The catalogue: the benchmark guide's table (docs/guides/benchmark.md) of the shipped profiles that
carry a performance record (model, nodes, the published figure, its conditions and source), generated
from those records, so the page cannot
say a figure the records do not (tests/unit/test_catalogue.py compares the two).

    python -m sparkcluster.bench.catalogue                   # print the table
    python -m sparkcluster.bench.catalogue --write docs/guides/benchmark.md  # replace the table between its markers

Order: published records first, by node count (most first), then by decode speed (fastest first);
then any record sparkcluster measured itself."""

from __future__ import annotations

import sys
from pathlib import Path

from sparkcluster.bench.perf_record import SUFFIX, PerfRecord, load
from sparkcluster.config.shipped import profiles_dir

BEGIN = (
    "<!-- catalogue: generated from env-profiles/*.perf.toml by "
    "`python -m sparkcluster.bench.catalogue --write docs/guides/benchmark.md` -->"
)
END = "<!-- end of catalogue -->"
HEADER = (
    "| profile | model | nodes | published figure | conditions | measured | source |\n|---|---|---|---|---|---|---|"
)


def shipped_dir() -> Path:
    return profiles_dir()


def shipped(folder: Path | None = None) -> list[tuple[str, PerfRecord]]:
    """(profile name, its record) for every record beside a shipped profile."""
    folder = folder or shipped_dir()
    return [(p.name.removesuffix(SUFFIX), load(p)) for p in sorted(folder.glob(f"*{SUFFIX}"))]


def _n(v: float) -> str:
    return f"{int(v):,}" if v == int(v) else f"{v:,.2f}"


def figure(rec: PerfRecord) -> str:
    """The headline: decode / prefill tok/s where the record has them, else output tok/s, each with its
    concurrency when the record has more than one run."""
    runs = sorted(rec.runs, key=lambda r: r.conditions.key)
    many = len(runs) > 1

    def at(r) -> str:
        return f" (c{r.conditions.concurrency})" if many else ""

    if all(r.figures.decode_tok_s is not None for r in runs):
        return "; ".join(
            f"decode {_n(r.figures.decode_tok_s)}"
            + (f" / prefill {_n(r.figures.prefill_tok_s)}" if r.figures.prefill_tok_s is not None else "")
            + f" tok/s{at(r)}"
            for r in runs
        )
    if all(r.figures.output_tok_s is not None for r in runs):
        return "output " + ", ".join(f"{_n(r.figures.output_tok_s)}{at(r)}" for r in runs) + " tok/s"
    return "; ".join(", ".join(f"{k} {_n(v)}" for k, v in r.figures.present().items()) + at(r) for r in runs)


def conditions(rec: PerfRecord) -> str:
    c = sorted({(r.conditions.input_tokens, r.conditions.output_tokens) for r in rec.runs})
    lengths = ", ".join(f"{i:,} in / {o:,} out" for i, o in c)
    conc = ",".join(str(x) for x in sorted({r.conditions.concurrency for r in rec.runs}))
    datasets = ", ".join(sorted({r.conditions.dataset for r in rec.runs}))
    return f"{lengths}, c{conc}, {datasets}; {rec.harness.name} {rec.harness.version}"


def source(rec: PerfRecord) -> str:
    """A link named by the recipe's folder (MODEL/dgx-spark...), else the publisher; a source that is
    no web page (a run of your own) as it is written."""
    url = rec.source.url
    if not url.startswith("https://"):
        return url
    parts = url.split("/")
    spark = next((i for i, p in enumerate(parts) if p.startswith("dgx-spark")), None)
    text = "/".join(parts[spark - 1 : spark + 1]) if spark else (rec.source.publisher or url)
    return f"[{text}]({url})"


def row(name: str, rec: PerfRecord) -> str:
    cells = [
        f"`{name}`",
        rec.software.model or "",
        str(rec.hardware.nodes),
        figure(rec),
        conditions(rec),
        rec.source.measured_at.isoformat(),
        source(rec),
    ]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _order(item: tuple[str, PerfRecord]):
    name, rec = item
    decode = max((r.figures.decode_tok_s or 0.0 for r in rec.runs), default=0.0)
    return (rec.kind != "published", -rec.hardware.nodes, -decode, name)


def table(records: list[tuple[str, PerfRecord]]) -> str:
    return "\n".join([HEADER, *(row(n, r) for n, r in sorted(records, key=_order))])


def block(records: list[tuple[str, PerfRecord]]) -> str:
    return f"{BEGIN}\n{table(records)}\n{END}"


def splice(text: str, records: list[tuple[str, PerfRecord]]) -> str:
    """`text` with the block between the markers replaced (ValueError when they are missing)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the catalogue's markers are missing: {BEGIN!r} ... {END!r}")
    return text[:start] + block(records) + text[end + len(END) :]


def in_text(text: str) -> str | None:
    """The block as it stands in `text`, or None."""
    start, end = text.find(BEGIN), text.find(END)
    return text[start : end + len(END)] if 0 <= start < end else None


def main(argv: list[str]) -> int:
    records = shipped()
    if argv[:1] == ["--write"] and len(argv) == 2:
        p = Path(argv[1])
        p.write_text(splice(p.read_text(), records))
        return 0
    if argv:
        print("usage: python -m sparkcluster.bench.catalogue [--write docs/guides/benchmark.md]", file=sys.stderr)
        return 2
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
