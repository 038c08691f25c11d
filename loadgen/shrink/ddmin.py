"""Delta debugging: Zeller and Hildebrandt's ``ddmin`` (*Simplifying and Isolating Failure-Inducing Input*, IEEE
TSE 28(2), 2002), over a set of items with one that is always kept (the victim: the predicate is about it).

Start with ``n = 2`` parts; a part that alone still fails becomes the set (``n = 2``); else a complement that
fails becomes the set (``n = max(n − 1, 2)``); else the parts are halved (``n = min(2n, size)``) until every
part is one item: the set is then 1-minimal (removing any one item makes the failure go). Bounded: at most
``max_tries`` predicate calls (a set asked twice is answered from the cache, not tried again) and ``deadline``
(a clock reading); at a bound the smallest failing set found so far is the answer. Pure: the predicate and the
clock are given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generic, Hashable, Sequence, TypeVar

T = TypeVar("T", bound=Hashable)


@dataclass(frozen=True)
class Try(Generic[T]):
    items: tuple[T, ...]  # the candidate set, the kept item included
    failed: bool  # the predicate held: the event reproduced
    value: float  # what the predicate measured (the victim's gap)


@dataclass
class DdminResult(Generic[T]):
    items: tuple[T, ...]  # the smallest failing set found (the kept item included)
    tries: list[Try[T]] = field(default_factory=list)
    stopped: str = ""  # "": 1-minimal; else the bound that stopped it ("max tries", "timeout")

    def failing(self) -> list[tuple[T, ...]]:
        """Every failing set tried, smallest first (ties: in the order tried)."""
        seen = {t.items: t for t in self.tries if t.failed}
        return sorted(seen, key=lambda s: len(s))


class _Bound(Exception):
    pass


def ddmin(items: Sequence[T], keep: T, test: Callable[[tuple[T, ...]], tuple[bool, float]], max_tries: int,
          deadline: float = float("inf"), clock: Callable[[], float] = lambda: 0.0,
          on_try: Callable[[Try[T]], None] = lambda t: None) -> DdminResult[T]:
    """The smallest subset of ``items`` (with ``keep``, always) for which ``test`` still says failed. ``items``
    must fail as given (the caller checks: it is the first try). ``test`` gets the candidate in ``items``'
    order, ``keep`` included, and returns (failed, the value it measured)."""
    order = {x: i for i, x in enumerate(items)}
    result: DdminResult[T] = DdminResult(tuple(items))
    cache: dict[frozenset[T], bool] = {}

    def fails(subset: Sequence[T]) -> bool:
        cand = tuple(sorted(set(subset) | {keep}, key=order.__getitem__))
        key = frozenset(cand)
        if key in cache:
            return cache[key]
        if len(result.tries) >= max_tries:
            raise _Bound("max tries")
        if clock() >= deadline:
            raise _Bound("timeout")
        failed, value = test(cand)
        cache[key] = failed
        result.tries.append(Try(cand, failed, value))
        on_try(result.tries[-1])
        if failed and len(cand) < len(result.items):
            result.items = cand
        return failed

    rest = [x for x in items if x != keep]
    try:
        if not fails(rest):
            result.stopped = "the whole set does not reproduce"
            return result
        n = 2
        while len(rest) >= 2:
            n = min(n, len(rest))
            parts = _split(rest, n)
            hit = next((p for p in parts if fails(p)), None)
            if hit is not None:
                rest, n = hit, 2
                continue
            if n > 2:
                hit = next((c for c in (_without(rest, p) for p in parts) if fails(c)), None)
                if hit is not None:
                    rest, n = hit, max(n - 1, 2)
                    continue
            if n >= len(rest):
                break
            n = min(2 * n, len(rest))
        if len(rest) == 1 and fails([]):  # the kept item alone: the others were not needed at all
            rest = []
    except _Bound as bound:
        result.stopped = str(bound)
    return result


def _split(items: list[T], n: int) -> list[list[T]]:
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


def _without(items: list[T], part: list[T]) -> list[T]:
    drop = set(part)
    return [x for x in items if x not in drop]
