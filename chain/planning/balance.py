"""Where to cut a chain of layers into K stages: pure arithmetic on per-layer costs.

A cut puts layers [0, c1), [c1, c2), ... [c_{K-1}, L) on stages 0..K-1; only positions a
model allows (one tensor crossing, `chain.stages.cut`) may be used. `partition` finds
the cuts that minimise the most expensive stage (the pipeline's bottleneck), as torchgpipe's
`balance_by_size`/`balance_by_time` do, by dynamic programming over the allowed positions;
costs may differ per stage (layers timed on each stage's device). `predicted_step` is the
step time those stage costs imply for a pipeline of M microbatches.
"""

from __future__ import annotations

from typing import Sequence


def even(n_layers: int, n_stages: int) -> list[int]:
    """Layers per stage for an even split (the first stages take one more when it does not divide)."""
    base, extra = divmod(n_layers, n_stages)
    return [base + (k < extra) for k in range(n_stages)]


def sizes_to_cuts(sizes: Sequence[int]) -> list[int]:
    """[4, 3, 3] -> [4, 7]: the layer index where each stage after the first begins."""
    cuts, total = [], 0
    for s in sizes[:-1]:
        total += s
        cuts.append(total)
    return cuts


def stage_costs(costs: Sequence[Sequence[float]], sizes: Sequence[int]) -> list[float]:
    """Each stage's cost for a split: `costs[k][i]` is layer i's cost on stage k's device."""
    out, start = [], 0
    for k, n in enumerate(sizes):
        out.append(float(sum(costs[k][start : start + n])))
        start += n
    return out


def weighted(sizes: Sequence[int], weights: Sequence[int]) -> bool:
    """Whether every stage of `sizes` holds at least one of the layers' `weights` (per layer)."""
    bounds = [0, *sizes_to_cuts(sizes), sum(sizes)]
    return all(sum(weights[a:b]) > 0 for a, b in zip(bounds, bounds[1:]))


def partition(
    costs: Sequence[Sequence[float]],
    n_stages: int,
    allowed: Sequence[int],
    required: Sequence[int] = (),
    weights: Sequence[int] | None = None,
) -> list[int] | None:
    """Layers per stage minimising the largest stage cost, cutting only at `allowed` positions.

    `costs[k][i]`: layer i's cost on stage k's device (give the same row K times when every
    device is alike); `allowed`: positions 1..L-1 a cut may take; `required`: positions that
    must be cuts (no stage spans them); `weights` (per layer, when given): every stage must hold
    some (a stage without weights would be a device that only passes tensors on). Returns None when
    K non-empty stages cannot be cut so.
    Ties go to the earliest cuts.
    """
    n = len(costs[0])
    points = sorted({0, n, *[c for c in [*allowed, *required] if 0 < c < n]})
    walls = sorted(c for c in required if 0 < c < n)
    prefix = [[0.0] for _ in range(n_stages)]
    for k in range(n_stages):
        for c in costs[k]:
            prefix[k].append(prefix[k][-1] + c)
    held = [0]  # weights of layers [0, i)
    for w in weights or [1] * n:
        held.append(held[-1] + w)
    inf = float("inf")
    # best[k][p]: the smallest possible largest-stage cost of stages 0..k covering layers [0, points[p]).
    best = [[inf] * len(points) for _ in range(n_stages)]
    back = [[-1] * len(points) for _ in range(n_stages)]
    for p in range(1, len(points)):
        if not any(w < points[p] for w in walls) and held[points[p]] > 0:
            best[0][p] = prefix[0][points[p]]
    for k in range(1, n_stages):
        for p in range(1, len(points)):
            for q in range(1, p):
                if any(points[q] < w < points[p] for w in walls) or held[points[p]] == held[points[q]]:
                    continue
                cost = max(best[k - 1][q], prefix[k][points[p]] - prefix[k][points[q]])
                if cost < best[k][p]:
                    best[k][p], back[k][p] = cost, q
    if best[n_stages - 1][-1] == inf:
        return None
    cuts, p = [], len(points) - 1
    for k in range(n_stages - 1, 0, -1):
        p = back[k][p]
        cuts.append(points[p])
    bounds = [0, *reversed(cuts), n]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def predicted_step(stage_times: Sequence[float], microbatches: int) -> float:
    """A pipeline step of M microbatches whose stages take `stage_times` per microbatch (forward
    and backward): the first microbatch passes every stage, then the slowest stage paces the rest."""
    return float(sum(stage_times) + (microbatches - 1) * max(stage_times))
