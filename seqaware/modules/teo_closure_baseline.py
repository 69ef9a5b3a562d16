"""The closure head's logistic-regression baseline (:mod:`seqaware.modules.teo_closure_head` docstring):
scikit-learn's ``LogisticRegression`` on the frozen embeddings of a presented pair, and the blend of its
probability into the head's answer."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def baseline_features(emb: np.ndarray, u: int, v: int) -> np.ndarray:
    """Features of the presented pair (u, v) of a plan with L2-normalised step embeddings ``emb`` (n, H)."""
    n = len(emb)
    eu, ev = emb[u], emb[v]
    position = [u / max(n - 1, 1), v / max(n - 1, 1), abs(v - u) / n, float(v == n - 1), n / 20, float(np.sign(v - u))]
    return np.concatenate([eu, ev, eu * ev, np.abs(eu - ev), position])


def fit_baseline(embeddings: Sequence[np.ndarray], plans: Sequence[dict[str, Any]], C: float = 1.0) -> Any:
    """scikit-learn ``LogisticRegression`` on both presentations of every labelled pair of the CaT-Bench plans."""
    from sklearn.linear_model import LogisticRegression

    X, y = [], []
    for emb, plan in zip(embeddings, plans):
        if plan.get("source") == "rfg":
            continue
        for a, b, label in plan["labels"]:
            for u, v in ((a, b), (b, a)):
                X.append(baseline_features(emb, u, v))
                y.append(int(label == "yes"))
    return LogisticRegression(C=C, max_iter=5000).fit(np.stack(X), np.array(y))


def baseline_probs(model: Any, emb: np.ndarray, pairs: Sequence[tuple[int, int]]) -> np.ndarray:
    """Mean probability of "yes" over the two presentations of each pair."""
    if not pairs:
        return np.zeros(0)
    X = np.stack([baseline_features(emb, u, v) for a, b in pairs for u, v in ((a, b), (b, a))])
    return model.predict_proba(X)[:, 1].reshape(-1, 2).mean(1)


def blend_probs(head: Any, baseline: Any, w: float) -> Any:
    """The answer's probability (:mod:`seqaware.modules.teo_closure_head` docstring, 6): ``(1 - w) head + w
    baseline`` (``head`` itself at w = 0)."""
    return head if w == 0 else (1 - w) * head + w * baseline
