"""Which of the head's image layers a worker lacks: pure functions over facts.

A layer is identified by its chain (its diff ID and every diff ID below it), which is how the
engine stores it: a worker "holds" the longest bottom-up prefix of the head's diff IDs that any of
its images has. `docker load` of a docker-archive on the classic graph-driver store skips reading a
layer's tar when it already has that chain (moby image/tarexport/load.go: `ls.Get(chainID)` before
`loadLayer`; checked on Debian's docker.io 20.10.24, overlay2), so the sender may leave those tars
out. The containerd image store imports every blob named in the archive instead, so it gets the
whole image (see transfer.elides).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageLayers:
    """One image on one node: its ID, diff IDs bottom up, and each layer's size when known."""

    id: str
    layers: tuple[str, ...]
    sizes: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Delta:
    """What moves to one worker: the layers above the prefix it holds."""

    total: int  # layers in the image
    held: int  # bottom-up prefix the worker holds
    move_bytes: int | None  # bytes of the layers that move, None when sizes are unknown
    elide: bool  # False: the whole image is sent (the store cannot skip layers)
    skip: tuple[str, ...] = ()  # diff IDs the sender leaves out
    keep: tuple[str, ...] = ()  # the image's other diff IDs (sent)
    order: tuple[str, ...] = ()  # the image's diff IDs bottom up (the sender names v1 layer dirs by them)

    @property
    def moving(self) -> int:
        return self.total - self.held if self.elide else self.total


def held_prefix(layers: tuple[str, ...] | list[str], chains: list[list[str]]) -> int:
    best = 0
    for ch in chains:
        n = 0
        for a, b in zip(layers, ch):
            if a != b:
                break
            n += 1
        best = max(best, n)
    return best


def sizes_from_history(history_sizes: list[int], n_layers: int) -> tuple[int, ...] | None:
    """Per-layer sizes from `docker history` sizes (oldest first). History lists every build step
    and no layer IDs; only when its non-empty entries are exactly one per layer is the mapping
    certain (a step that made a layer of size 0 would shift it)."""
    nonzero = [s for s in history_sizes if s > 0]
    return tuple(nonzero) if len(nonzero) == n_layers else None


def delta(image: ImageLayers, worker_chains: list[list[str]], elide: bool = True) -> Delta:
    n = len(image.layers)
    held = held_prefix(image.layers, worker_chains) if elide else 0
    moving = image.layers[held:]
    # a diff ID held below may recur above (two steps making the same files): the copy above must
    # still be sent, and the sender matches by diff ID, so such an ID is not skipped at all
    skip = tuple(d for d in dict.fromkeys(image.layers[:held]) if d not in moving)
    move = sum(image.sizes[held:]) if image.sizes is not None else None
    keep = tuple(d for d in dict.fromkeys(image.layers) if d not in skip)
    return Delta(n, held, move, elide, skip, keep, tuple(image.layers))


def shared_delta(image: ImageLayers, workers: list[tuple[list[list[str]], bool]]) -> Delta:
    """What one stream to several workers (a chain) carries, `workers` being each one's (layer
    chains, elide): only the layers every one of them holds stay behind (the smallest held
    prefix), so each still gets every layer it lacks; a store that cannot skip layers makes the
    stream carry the whole image for all."""
    elide = all(e for _, e in workers)
    return min((delta(image, chains, elide) for chains, _ in workers), key=lambda d: d.held)


def mb(n: int | None) -> str:
    if n is None:
        return "size unknown"
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def describe(d: Delta, worker: str) -> str:
    if not d.elide:
        return f"all {d.total} layers ({mb(d.move_bytes)}) to {worker}: its image store cannot skip layers it holds"
    if d.held == d.total:
        return f"no layer data to {worker} (it holds all {d.total} layers): manifest and config only"
    return f"{d.moving} of {d.total} layers ({mb(d.move_bytes)}) to {worker}" + (
        f"; it holds the bottom {d.held}" if d.held else "; it holds none of them"
    )
