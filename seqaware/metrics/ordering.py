"""Sentence/step-ordering metrics (Wu et al., ACL 2022) with multiple references and DAGs.

An *order* is a sequence of step ids (any hashable items, usually ints) in execution order. A
prediction and a reference must hold the same items, each exactly once; anything else raises
``ValueError``. NumPy arrays and torch tensors are accepted and read with ``tolist()``.

Per-instance metrics (:func:`order_metrics`): one declared list, :data:`SEQUENCING_METRICS`, which the
corpus scores, the logged ``val/`` and ``test/`` metrics, the per-category reports (:mod:`seqaware.reports`, the
W&B category table), ``scripts/tools/score_predictions.py`` and the ``joint`` reference-selection rule all read, so a
new metric is one entry there.  Built in, with ``n`` items, ``pred`` the predicted and ``gold`` the reference
order:

* ``acc`` -- share of positions ``k`` with ``pred[k] == gold[k]``.
* ``pmr`` -- perfect match ratio: 1.0 if the orders are identical, else 0.0.
* ``dist`` -- sum over items of ``|position in pred - position in gold|`` (Wu et al.'s "Dist";
  lower is better; a uniformly random order of 5 steps scores 8 on average).
* ``lcs`` -- length of the longest common subsequence of the two orders.
* ``lcstr`` -- length of the longest common substring (longest contiguous run of items that
  appears, contiguously and in the same order, in both).
* ``tau`` -- Kendall's tau between the orders: ``1 - 2 * inversions / C(n, 2)`` where an
  inversion is a pair of items the two orders put in opposite order; 1.0 when ``n == 1``.

Corpus level (:func:`corpus_order_metrics`, :class:`seqaware.metrics.torch_metrics.OrderingMetrics`) each instance may come with
several valid reference orders; see :func:`select_reference` for which one is scored. With a
dependency DAG (``(num_steps, edges)``, edges ``(i, j)`` = "i before j", see :mod:`seqaware.dag`)
an instance is also scored against the pairs the DAG constrains (:func:`dag_order_metrics`),
without enumerating the DAG's orders.

:func:`pairwise_relations` and :func:`order_kappa` implement the pairwise-relation encoding of an
order over all ``n (n - 1)`` ordered pairs and Cohen's kappa between two orders (Wu et al. 2022,
appendix B.3.1).
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Sequence

import numpy as np
import torch

from seqaware import dag as dag_utils

__all__ = [
    "ORDER_KEYS",
    "DAG_KEYS",
    "REFERENCE_SELECTIONS",
    "SEQUENCING_METRICS",
    "OrderMetric",
    "order_keys",
    "ranked_metrics",
    "order_metrics",
    "select_reference",
    "dag_order_metrics",
    "corpus_order_metrics",
    "pairwise_relations",
    "order_kappa",
]

#: Keys of :func:`dag_order_metrics`.
DAG_KEYS = ("valid", "violated", "tau")

# Corpus-level accumulation groups: name -> number of summed values.
_ORDER_GROUPS = ("multi", "single", "subset_single", "subset_multi")
_COUNT_KEYS = ("n", "n_single", "n_multi", "dag/n")


# ---------------------------------------------------------------- input checks
def _as_order(order: Any, name: str) -> list:
    """A plain list of the items of ``order`` (arrays and tensors are read with ``tolist()``)."""
    if isinstance(order, (np.ndarray, torch.Tensor)):
        order = order.tolist()
    if isinstance(order, (str, bytes)) or not isinstance(order, Iterable):
        raise ValueError(f"{name} must be a sequence of step ids, got {order!r}")
    return list(order)


def _gold_positions(pred: Any, gold: Any, names: tuple[str, str] = ("pred", "gold")) -> list[int]:
    """``p[k]`` = position in ``gold`` of ``pred[k]``, after checking both are permutations of the
    same items; errors call the two ``names`` (the caller's argument names)."""
    pred_name, gold_name = names
    pred = _as_order(pred, pred_name)
    gold = _as_order(gold, gold_name)
    try:
        where = {item: k for k, item in enumerate(gold)}
        pred_set = set(pred)
    except TypeError as err:
        raise ValueError(f"step ids must be hashable: {err}") from None
    if len(where) != len(gold):
        raise ValueError(f"{gold_name} has duplicate items: {gold!r}")
    if len(pred_set) != len(pred):
        raise ValueError(f"{pred_name} has duplicate items: {pred!r}")
    if pred_set != set(where):
        raise ValueError(f"{pred_name} and {gold_name} are not permutations of each other: "
                         f"{pred_name}={pred!r}, {gold_name}={gold!r}")
    if not pred:
        raise ValueError("orders must hold at least one item")
    return [where[item] for item in pred]


# ---------------------------------------------------------------- per-instance metrics
def _longest_increasing(values: Sequence[int]) -> int:
    """Length of the longest strictly increasing subsequence (patience sorting, O(n log n))."""
    tails: list[int] = []
    for v in values:
        k = bisect_left(tails, v)
        if k == len(tails):
            tails.append(v)
        else:
            tails[k] = v
    return len(tails)


def _longest_consecutive_run(values: Sequence[int]) -> int:
    """Longest run of adjacent entries with ``values[k + 1] == values[k] + 1``."""
    best = run = 1
    for prev, cur in zip(values, values[1:]):
        run = run + 1 if cur == prev + 1 else 1
        best = max(best, run)
    return best


def _inversions(values: Sequence[int]) -> int:
    """Number of pairs ``k < l`` with ``values[k] > values[l]``."""
    arr = np.asarray(values)
    return int(np.triu(arr[:, None] > arr[None, :], k=1).sum())


@dataclass(frozen=True)
class OrderMetric:
    """One per-instance ordering metric of the sequencing task (an entry of :data:`SEQUENCING_METRICS`).

    ``score(p)``: its value for a prediction whose k-th item is at position ``p[k]`` of the reference (``p`` a
    permutation of ``0 .. n-1``; the identity is a perfect prediction), a float.  ``higher_is_better``: its
    direction.  ``selection``: its place in the key the ``joint`` reference-selection rule maximises, 1 first
    (a metric where lower is better enters negated); None: the rule does not rank on it.
    """

    name: str
    score: Callable[[Sequence[int]], float]
    higher_is_better: bool = True
    selection: int | None = None


def _accuracy(p: Sequence[int]) -> float:
    return sum(pk == k for k, pk in enumerate(p)) / len(p)


def _perfect_match(p: Sequence[int]) -> float:
    return float(all(pk == k for k, pk in enumerate(p)))


def _distance(p: Sequence[int]) -> float:
    return float(sum(abs(pk - k) for k, pk in enumerate(p)))


def _common_subsequence(p: Sequence[int]) -> float:
    return float(_longest_increasing(p))


def _common_substring(p: Sequence[int]) -> float:
    return float(_longest_consecutive_run(p))


def _kendall_tau(p: Sequence[int]) -> float:
    pairs = len(p) * (len(p) - 1) // 2
    return 1.0 if pairs == 0 else 1.0 - 2.0 * _inversions(p) / pairs


#: The sequencing task's metrics, in the order they are computed and reported (the ``val/`` / ``test/`` keys,
#: ``single/`` / ``subset_*/`` variants, report columns): a new metric is one more entry, read by every consumer
#: when it runs.  ``selection`` gives the ``joint`` rule's key ``(pmr, acc, tau, lcs, lcstr, -dist)``.
SEQUENCING_METRICS: list[OrderMetric] = [
    OrderMetric("acc", _accuracy, selection=2),
    OrderMetric("pmr", _perfect_match, selection=1),
    OrderMetric("dist", _distance, higher_is_better=False, selection=6),
    OrderMetric("lcs", _common_subsequence, selection=4),
    OrderMetric("lcstr", _common_substring, selection=5),
    OrderMetric("tau", _kendall_tau, selection=3),
]


def order_keys() -> tuple[str, ...]:
    """The names of :data:`SEQUENCING_METRICS`, in order; a name or a ``selection`` place taken twice raises
    ``ValueError`` naming it."""
    names = [m.name for m in SEQUENCING_METRICS]
    places = [m.selection for m in SEQUENCING_METRICS if m.selection is not None]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"SEQUENCING_METRICS names {twice} more than once")
    taken = sorted({k for k in places if places.count(k) > 1})
    if taken:
        raise ValueError(f"SEQUENCING_METRICS: several metrics take the joint selection places {taken}: "
                         f"{[m.name for m in SEQUENCING_METRICS if m.selection in taken]}")
    return tuple(names)


def __getattr__(name: str) -> Any:
    """``ORDER_KEYS``: :func:`order_keys`, read when asked (the list may have grown since import)."""
    if name == "ORDER_KEYS":
        return order_keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def order_metrics(pred: Sequence[Hashable], gold: Sequence[Hashable]) -> dict[str, float]:
    """Every metric of :data:`SEQUENCING_METRICS` (``acc, pmr, dist, lcs, lcstr, tau``, ...) of ``pred`` against
    ``gold`` (see the module docstring), in the list's order.

    Both are read as step ids in execution order and must be permutations of each other
    (``ValueError`` otherwise). Because the orders are permutations, the longest common
    subsequence is the longest increasing subsequence of the gold positions of the predicted
    items, and a common substring is a run of predicted items whose gold positions are
    consecutive.
    """
    p = _gold_positions(pred, gold)
    order_keys()  # the list is well formed
    return {m.name: float(m.score(p)) for m in SEQUENCING_METRICS}


#: Rules of :func:`select_reference`: ``joint`` (seqaware's default) and ``wu2022`` (the authors' code).
REFERENCE_SELECTIONS = ("joint", "wu2022")


def _minimum_swaps(p: Sequence[int], weighted: bool = False) -> int:
    """Minimum number of swaps that sort ``p`` (``n`` minus the number of cycles of the permutation).

    With ``weighted``: each cycle of length ``c`` adds ``(c - 1) * |p[i] - i|`` where ``i`` is the
    cycle's smallest position -- the "wms" of Wu et al.'s released ``trainers/metrics.py`` (``MS``
    with ``weighted=True``); used here only as a tie-breaker of ``reference_selection=wu2022``.
    ``p[k]`` is the gold position of the k-th predicted item (as returned by ``_gold_positions``).
    """
    # the authors' MS walks the permutation k -> (position in pred of gold[k]), the inverse of p
    inverse = [0] * len(p)
    for k, pk in enumerate(p):
        inverse[pk] = k
    seen = [False] * len(p)
    total = 0
    for start in range(len(p)):
        if seen[start] or inverse[start] == start:
            continue
        size, k = 0, start
        while not seen[k]:
            seen[k] = True
            k = inverse[k]
            size += 1
        total += (size - 1) * (abs(inverse[start] - start) if weighted else 1)
    return total


#: The tuple ``reference_selection=wu2022`` maximises: the authors' code, fixed (a new metric never joins it).
WU2022_RANKING = ("acc", "pmr", "lcstr", "lcs", "tau", "ms", "wms", "dist")


def _joint_ranking() -> list[OrderMetric]:
    order_keys()  # one metric per place
    return sorted((m for m in SEQUENCING_METRICS if m.selection is not None), key=lambda m: m.selection)


def ranked_metrics(rule: str) -> tuple[str, ...]:
    """The metrics ``rule`` ranks the references on, most important first, ``-NAME`` for one it minimises:
    ``joint``: the :data:`SEQUENCING_METRICS` with a ``selection`` place (``pmr, acc, tau, lcs, lcstr, -dist``);
    ``wu2022``: :data:`WU2022_RANKING` (``ms`` / ``wms``: the minimum numbers of swaps, see
    :func:`select_reference`)."""
    if _check_reference_selection(rule) == "wu2022":
        return WU2022_RANKING
    return tuple(m.name if m.higher_is_better else f"-{m.name}" for m in _joint_ranking())


def _selection_key(scores: dict[str, float], p: Sequence[int], rule: str) -> tuple[float, ...]:
    """The tuple :func:`select_reference` maximises (lexicographically) under ``rule``."""
    if rule == "joint":
        return tuple(scores[m.name] if m.higher_is_better else -scores[m.name] for m in _joint_ranking())
    # wu2022: Wu et al.'s released code, trainers/metrics.py, multiref_metrics(..., multiref_metrics="max"):
    # the per-reference tuple follows METRICS = [partial_match (Acc), exact_match (PMR), lcs_substr,
    # lcs, tau, ms, wms, distance_based] and `sorted(metric_list, reverse=True)[0]` is kept -- every
    # entry is maximised, minimum swaps and Dist included (they only break ties of the first five);
    # the sort is stable, so on a full tie the first listed reference wins.
    return (scores["acc"], scores["pmr"], scores["lcstr"], scores["lcs"], scores["tau"],
            float(_minimum_swaps(p)), float(_minimum_swaps(p, weighted=True)), scores["dist"])


def _check_reference_selection(rule: Any) -> str:
    if rule not in REFERENCE_SELECTIONS:
        raise ValueError(f"reference_selection must be one of {REFERENCE_SELECTIONS}, got {rule!r}")
    return rule


def select_reference(pred: Sequence[Hashable], references: Sequence[Sequence[Hashable]],
                     reference_selection: str = "joint") -> tuple[int, dict[str, float]]:
    """The reference a prediction is scored against, as ``(index, order_metrics(pred, ref))``.

    All metrics of the instance then come from that single reference (no per-metric
    cherry-picking). ``reference_selection`` picks the rule; both maximise a tuple of metrics
    compared lexicographically, and on a full tie the reference listed first wins:

    * ``joint`` (default): ``(pmr, acc, tau, lcs, lcstr, -dist)`` -- a perfect match first, then
      the most positions right, then the highest tau, ...: the metrics of :data:`SEQUENCING_METRICS` with a
      ``selection`` place, in that order (:func:`ranked_metrics`);
    * ``wu2022``: the rule of Wu et al.'s released evaluation (``trainers/metrics.py``,
      ``multiref_metrics``): ``(acc, pmr, lcstr, lcs, tau, ms, wms, dist)`` where ``ms``/``wms``
      are the (weighted) minimum numbers of swaps; the last three only break ties of the first
      five and, as in that code, are maximised too.
    """
    rule = _check_reference_selection(reference_selection)
    if isinstance(references, (str, bytes)) or not isinstance(references, Iterable):
        raise ValueError(f"references must be a list of one or more orders, got {references!r}")
    references = list(references)
    if not references:
        raise ValueError("references must hold at least one order")
    best_index, best_scores, best_key = -1, None, None
    for index, ref in enumerate(references):
        if not isinstance(ref, (list, tuple, np.ndarray, torch.Tensor)):
            raise ValueError(
                f"each reference must be an order (list of step ids), got {ref!r}; "
                "pass references as a list of orders, e.g. [[0, 1, 2]]"
            )
        scores = order_metrics(pred, ref)
        key = _selection_key(scores, _gold_positions(pred, ref) if rule == "wu2022" else (), rule)
        if best_key is None or key > best_key:
            best_index, best_scores, best_key = index, scores, key
    return best_index, best_scores


def dag_order_metrics(pred: Sequence[int], num_steps: int, edges: Iterable) -> dict[str, float]:
    """How well ``pred`` (an order of steps ``0 .. num_steps - 1``) respects a dependency DAG.

    The *constrained pairs* are the pairs ``(i, j)`` of the DAG's transitive closure (a path
    ``i -> ... -> j`` exists, so every valid order puts ``i`` before ``j``). With ``m`` such
    pairs of which ``d`` are put in the wrong order by ``pred``:

    * ``valid`` -- 1.0 if ``pred`` is a linear extension of the DAG (``d == 0``), else 0.0;
    * ``violated`` -- ``d / m``;
    * ``tau`` -- Kendall's tau restricted to the constrained pairs, ``(m - d - d) / m``
      (concordant minus discordant over ``m``): 1 for a valid order, -1 when every constraint is
      reversed.

    A DAG without edges constrains nothing: ``valid = 1, violated = 0, tau = 1`` (vacuously).
    Raises ``ValueError`` if ``pred`` is not a permutation of ``0 .. num_steps - 1`` or the edges
    are invalid, :class:`seqaware.dag.CycleError` if they have a cycle.
    """
    if not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}")
    p = _gold_positions(pred, list(range(num_steps)), ("pred", "range(num_steps)"))
    reach = dag_utils.transitive_closure(num_steps, edges)
    position = np.empty(num_steps, dtype=np.int64)
    position[np.asarray(p)] = np.arange(num_steps)  # position[step] = index of step in pred
    first, second = np.nonzero(reach)
    m = len(first)
    if m == 0:
        return {"valid": 1.0, "violated": 0.0, "tau": 1.0}
    d = int((position[first] > position[second]).sum())
    return {"valid": float(d == 0), "violated": d / m, "tau": (m - 2 * d) / m}


# ---------------------------------------------------------------- corpus accumulation
@dataclass
class _InstanceScores:
    """Everything one instance contributes to the corpus metrics."""

    multi: dict[str, float]          # against the selected reference
    single: dict[str, float]         # against the first (authored) reference
    num_references: int
    dag: dict[str, float] | None     # None unless the instance has a DAG with >= 1 edge


def _score_instance(pred: Any, references: Any, dag: Any = None, reference_selection: str = "joint") -> _InstanceScores:
    if isinstance(references, (np.ndarray, torch.Tensor)):
        references = references.tolist()
    index, multi = select_reference(pred, references, reference_selection)
    single = multi if index == 0 else order_metrics(pred, references[0])
    dag_scores = None
    if dag is not None:
        try:
            num_steps, edges = dag
        except (TypeError, ValueError):
            raise ValueError(f"a DAG must be given as (num_steps, edges) or None, got {dag!r}") from None
        edges = [] if edges is None else list(edges)
        if edges:
            dag_scores = dag_order_metrics(pred, num_steps, edges)
    return _InstanceScores(multi, single, len(references), dag_scores)


def _empty_totals() -> dict[str, np.ndarray]:
    """Sums of every accumulated quantity (the corpus metrics are ratios of these)."""
    totals = {group: np.zeros(len(order_keys())) for group in _ORDER_GROUPS}
    totals["dag"] = np.zeros(len(DAG_KEYS))
    totals["counts"] = np.zeros(len(_COUNT_KEYS))
    return totals


def _accumulate(preds: Sequence, references: Sequence, dags: Sequence | None = None,
                reference_selection: str = "joint") -> dict[str, np.ndarray]:
    """Score every instance and sum the scores into :func:`_empty_totals` buckets."""
    _check_reference_selection(reference_selection)
    preds, references = list(preds), list(references)
    if len(preds) != len(references):
        raise ValueError(f"got {len(preds)} predictions but {len(references)} reference lists")
    if dags is None:
        dags = [None] * len(preds)
    dags = list(dags)
    if len(dags) != len(preds):
        raise ValueError(f"got {len(preds)} predictions but {len(dags)} DAGs")
    totals = _empty_totals()
    keys = order_keys()
    for i, (pred, refs, dag) in enumerate(zip(preds, references, dags)):
        try:
            scores = _score_instance(pred, refs, dag, reference_selection)
        except ValueError as err:
            if type(err) is ValueError:  # name the instance; keep subclasses (CycleError) as they are
                raise ValueError(f"instance {i}: {err}") from err
            raise
        multi = np.array([scores.multi[k] for k in keys])
        totals["multi"] += multi
        totals["single"] += np.array([scores.single[k] for k in keys])
        subset = "subset_single" if scores.num_references == 1 else "subset_multi"
        totals[subset] += multi
        totals["counts"] += [1.0, float(subset == "subset_single"), float(subset == "subset_multi"), 0.0]
        if scores.dag is not None:
            totals["dag"] += np.array([scores.dag[k] for k in DAG_KEYS])
            totals["counts"][3] += 1.0
    return totals


def _finalize(totals: dict[str, np.ndarray]) -> dict[str, float]:
    """Averages from summed totals; a group with no instances contributes no keys (never NaN)."""
    n, n_single, n_multi, dag_n = (float(c) for c in totals["counts"])
    keys = order_keys()
    out: dict[str, float] = {}
    if n > 0:
        out.update({k: float(v) / n for k, v in zip(keys, totals["multi"], strict=True)})
        out.update({f"single/{k}": float(v) / n for k, v in zip(keys, totals["single"], strict=True)})
    if n_single > 0:
        out.update({f"subset_single/{k}": float(v) / n_single
                    for k, v in zip(keys, totals["subset_single"], strict=True)})
    if n_multi > 0:
        out.update({f"subset_multi/{k}": float(v) / n_multi for k, v in zip(keys, totals["subset_multi"], strict=True)})
    out.update({"n": n, "n_single": n_single, "n_multi": n_multi})
    if dag_n > 0:
        out.update({f"dag/{k}": float(v) / dag_n for k, v in zip(DAG_KEYS, totals["dag"])})
        out["dag/n"] = dag_n
    return out


def corpus_order_metrics(
    preds: Sequence[Sequence[Hashable]],
    references: Sequence[Sequence[Sequence[Hashable]]],
    dags: Sequence[tuple[int, Iterable] | None] | None = None,
    reference_selection: str = "joint",
) -> dict[str, float]:
    """Corpus averages of the ordering metrics, with multiple references and optional DAGs.

    Args:
        preds: one predicted order per instance.
        references: per instance, a list of one or more valid orders; the first is the authored
            ("gold") order.
        dags: optional, per instance ``(num_steps, edges)`` or None; predictions of instances
            with a DAG must be orders of the ints ``0 .. num_steps - 1``.
        reference_selection: ``joint`` (default) or ``wu2022``: which reference each instance is
            scored against (:func:`select_reference`).

    Returns a dict of floats:

    * ``acc, pmr, dist, lcs, lcstr, tau`` (every :data:`SEQUENCING_METRICS` entry) -- multi-reference
      averages: each instance is scored against ONE reference, picked by ``reference_selection`` (:func:`select_reference`):
      ``joint`` maximises ``(pmr, acc, tau, lcs, lcstr, -dist)``, ``wu2022`` the tuple of
      Wu et al.'s released code ``(acc, pmr, lcstr, lcs, tau, ...)``; the first listed
      reference wins full ties;
    * ``single/<metric>`` -- averages against the first reference only;
    * ``subset_single/<metric>`` and ``subset_multi/<metric>`` -- the multi-reference averages
      over the instances with exactly one reference and with more than one (Wu et al. 2022,
      Table 4); a subset without instances has no keys;
    * ``n``, ``n_single``, ``n_multi`` -- instance counts;
    * with ``dags``: ``dag/valid``, ``dag/violated``, ``dag/tau`` (:func:`dag_order_metrics`)
      averaged over the instances whose DAG has at least one edge, and their count ``dag/n``;
      these keys are absent when there is no such instance.

    An empty corpus returns only the (zero) counts.
    """
    return _finalize(_accumulate(preds, references, dags, reference_selection))


# ---------------------------------------------------------------- pairwise relations and kappa
def _item_order(order: list, items: Sequence[Hashable] | None) -> list:
    """The canonical item order used to enumerate pairs: ``items`` or the sorted items."""
    if items is None:
        try:
            return sorted(order)
        except TypeError:
            raise ValueError("the items cannot be sorted; pass items= to fix the pair order") from None
    items = _as_order(items, "items")
    _gold_positions(items, order, ("items", "order"))  # same items, no duplicates
    return items


def pairwise_relations(order: Sequence[Hashable], items: Sequence[Hashable] | None = None) -> np.ndarray:
    """Pairwise-relation one-hot encoding of an order (Wu et al. 2022, appendix B.3.1).

    With the items in a canonical order ``u_0, ..., u_{n-1}`` (``items`` if given, else the
    sorted items), every *ordered* pair ``(u_a, u_b)``, ``a != b``, is enumerated in
    lexicographic order ``(0, 1), (0, 2), ..., (0, n-1), (1, 0), (1, 2), ..., (n-1, n-2)`` and
    encoded as 1 iff ``u_a`` comes before ``u_b`` in ``order``. Returns an int64 array of length
    ``n (n - 1)``, half of it ones. This is the paper's enumeration: for items 1, 2, 3 the pairs
    are {12, 13, 21, 23, 31, 32}, R123 = 110100 and R231 = 001110 (B.3.1).
    """
    order = _as_order(order, "order")
    canonical = _item_order(order, items)
    _gold_positions(canonical, order, ("items", "order"))  # the order itself: duplicates, membership
    where = {item: k for k, item in enumerate(order)}
    position = np.array([where[item] for item in canonical], dtype=np.int64)
    n = len(canonical)
    first, second = np.nonzero(~np.eye(n, dtype=bool))  # row-major: (a, b) in lexicographic order
    return (position[first] < position[second]).astype(np.int64)


def order_kappa(order_a: Sequence[Hashable], order_b: Sequence[Hashable], items: Sequence[Hashable] | None = None) -> float:
    """Cohen's kappa between the pairwise-relation encodings of two orders of the same items.

    ``kappa = (p_o - p_e) / (1 - p_e)`` with ``p_o`` the share of pairs on which the encodings
    agree and ``p_e = q_a q_b + (1 - q_a)(1 - q_b)`` the agreement expected by chance, ``q_a`` and
    ``q_b`` being the shares of 1s in each encoding (Wu et al. 2022, B.3.1). Both encodings hold
    every ordered pair, so ``q_a = q_b = 1/2``, ``p_e = 1/2`` and ``kappa = 2 p_o - 1``, which
    equals Kendall's tau between the orders: (1 2 3) vs (1 3 2) gives 1/3, (1 2 3) vs (3 2 1)
    gives -1. With fewer than two items there is no pair and the result is 1.0. The pair order
    is fixed by ``items`` (default: the sorted items), see :func:`pairwise_relations`.
    """
    a = _as_order(order_a, "order_a")
    b = _as_order(order_b, "order_b")
    _gold_positions(a, b, ("order_a", "order_b"))  # same items, no duplicates
    canonical = _item_order(a, items)
    return binary_kappa(pairwise_relations(a, canonical), pairwise_relations(b, canonical))


def binary_kappa(x: Sequence[int], y: Sequence[int]) -> float:
    """Cohen's kappa between two 0/1 encodings, with the conventions of :func:`order_kappa`.

    ``kappa = (p_o - p_e) / (1 - p_e)``, ``p_e = q_x q_y + (1 - q_x)(1 - q_y)``; when both
    encodings are constant (``p_e == 1``) the result is 1.0 if they agree everywhere, else 0.0;
    empty encodings give 1.0. For encodings of two orders this equals ``order_kappa``.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"encodings differ in length: {x.size} vs {y.size}")
    if x.size == 0:
        return 1.0
    observed = float(np.mean(x == y))
    qx, qy = float(np.mean(x)), float(np.mean(y))
    expected = qx * qy + (1.0 - qx) * (1.0 - qy)
    if np.isclose(expected, 1.0):
        return 1.0 if observed == 1.0 else 0.0
    return (observed - expected) / (1.0 - expected)

