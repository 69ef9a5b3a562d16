"""Our results in the papers' columns (scripts/studies/paper_tables.py): reading our result files (test metrics of
a run, eval_teo results, the ``NAME@...=PATH`` specs) and turning them into rows of each paper's tables."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from scripts.studies.paper_tables_published import SPECS
from scripts.studies.paper_tables_schema import (_MULTI_REF, _SUBSET, DASH, ISO_SETTINGS, NA, SEQ_DATASETS, SEQ_MODALITIES,
                                         _number)
from seqaware.io import parse_test_metrics
from seqaware.vlm.prompts import ISO_STRATEGIES, MODALITIES, STRATEGIES


# ---------------------------------------------------------------- reading our result files
def _score_predictions_table(text: str) -> dict[str, float] | None:
    """The ``predictions`` row of the table ``scripts/tools/score_predictions.py`` prints, or None."""
    header = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == "system":
            header = cells
        elif header and cells[0] == "predictions" and len(cells) == len(header):
            return {k: float(v) for k, v in zip(header[1:], cells[1:]) if _number(v) is not None}
    return None


def read_metrics(path: str | Path) -> dict[str, float]:
    """Test metrics of a run: a JSON dict (``test_metrics.json``), the last ``TEST_METRICS_JSON`` line
    of a log, or score_predictions.py's table; ``test/`` prefixes removed."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"{path}: no such metrics file")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        metrics: Any = json.loads(text)
    except json.JSONDecodeError:
        try:
            metrics = parse_test_metrics(text)
        except json.JSONDecodeError as err:
            raise SystemExit(f"{path}: malformed TEST_METRICS_JSON line ({err})") from None
        if metrics is None:
            metrics = _score_predictions_table(text)
        if metrics is None:
            raise SystemExit(f"{path}: neither a JSON metrics dict, a log with a TEST_METRICS_JSON line "
                             "nor the table of scripts/tools/score_predictions.py")
    if isinstance(metrics, Mapping) and isinstance(metrics.get("metrics"), Mapping):
        metrics = metrics["metrics"]
    if not isinstance(metrics, Mapping):
        raise SystemExit(f"{path}: expected a JSON object of metrics")
    return {k.removeprefix("test/"): float(v) for k, v in metrics.items() if _number(v) is not None}


def load_results(paths: Iterable[str | Path], task: str) -> list[dict[str, Any]]:
    """eval_teo result JSONs of ``task``; an unreadable file or another task's result is an error naming the file."""
    results = []
    for path in paths:
        path = Path(path)
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise SystemExit(f"{path}: cannot read an eval_teo result ({err})") from None
        if not isinstance(result, Mapping):
            raise SystemExit(f"{path}: not a result of scripts/tools/eval_teo.py (expected a JSON object)")
        missing = [k for k in ("task", "model", "strategy", "modality", "rows") if k not in result]
        if missing:
            raise SystemExit(f"{path}: not a result of scripts/tools/eval_teo.py (missing {', '.join(missing)})")
        if result["task"] != task:
            raise SystemExit(f"{path}: a {result['task']!r} result, not {task!r}; pass it to --{result['task']}")
        if not isinstance(result["rows"], Mapping):
            raise SystemExit(f"{path}: field 'rows' must map a system name to its metrics")
        results.append(dict(result, _path=str(path)))
    return results


def _spec_parts(spec: str, flag: str, what: str) -> tuple[str, str, str, Path]:
    """``NAME@A/B=PATH`` -> (name, a, b, path)."""
    try:
        left, path = spec.split("=", 1)
        name, where = left.rsplit("@", 1)
        first, second = where.split("/", 1)
    except ValueError:
        raise SystemExit(f"{flag} {spec!r}: expected NAME@{what}=PATH") from None
    if not name or not first or not second or not path:
        raise SystemExit(f"{flag} {spec!r}: expected NAME@{what}=PATH")
    return name, first.lower(), second.lower(), Path(path)


def parse_sequencing_spec(spec: str) -> tuple[str, str, str, Path]:
    """``NAME@DATASET/MODALITY=PATH`` -> (name, dataset, modality, path), checked against Wu et al.'s tables."""
    name, dataset, modality, path = _spec_parts(spec, "--sequencing", "DATASET/MODALITY")
    if dataset not in dict(SEQ_DATASETS):
        raise SystemExit(f"--sequencing {spec!r}: dataset {dataset!r} is not a column of Wu et al.'s tables "
                         f"({', '.join(dict(SEQ_DATASETS))})")
    if modality not in SEQ_MODALITIES:
        raise SystemExit(f"--sequencing {spec!r}: modality {modality!r}, expected one of {', '.join(SEQ_MODALITIES)}")
    return name, dataset, modality, path


def parse_teo_spec(spec: str) -> tuple[str, str, str, Path]:
    """``NAME@STRATEGY/MODALITY=PATH`` (a train.py run) -> (name, strategy, modality, path)."""
    if "@" not in spec:
        raise SystemExit(f"--teo {spec!r}: no such result file (or give a train.py run as NAME@STRATEGY/MODALITY=PATH)")
    name, strategy, modality, path = _spec_parts(spec, "--teo", "STRATEGY/MODALITY")
    if strategy not in STRATEGIES:
        raise SystemExit(f"--teo {spec!r}: strategy {strategy!r}, expected one of {', '.join(STRATEGIES)}")
    if modality not in MODALITIES:
        raise SystemExit(f"--teo {spec!r}: modality {modality!r}, expected one of {', '.join(MODALITIES)}")
    return name, strategy, modality, path


# ---------------------------------------------------------------- our rows in each paper's columns
def _percent(value: float | None) -> float | str:
    return NA if value is None else 100 * value


def _raw(value: float | None) -> float | str:
    return NA if value is None else value


def _multi_subset_single(metrics: Mapping[str, float], key: str) -> float | None:
    """Single-reference mean over the multi-reference instances: n * single/<key> minus the
    single-reference instances' share (on them single- and multi-reference scores are equal)."""
    n, n_single, n_multi = (metrics.get(k) for k in ("n", "n_single", "n_multi"))
    total = metrics.get(f"single/{key}")
    if not n or not n_multi or total is None or n_single is None:
        return None
    single_part = metrics.get(f"subset_single/{key}", 0.0) * n_single if n_single else 0.0
    return (n * total - single_part) / n_multi


def sequencing_rows(entries: Sequence[tuple[str, str, str, Mapping[str, float]]]) -> dict[tuple[str, str], list[dict]]:
    """Our rows of Wu et al. Tables 2, 3, 4 and 10 from ``(name, dataset, modality, metrics)``."""
    out: dict[tuple[str, str], list[dict]] = {("wu2022", t): [] for t in ("Table 2", "Table 3", "Table 4", "Table 10")}
    blank = {k: NA for k in ("acc", "pmr", "lq", "lr", "tau", "dist")}
    by_model: dict[tuple[str, str], dict] = {}
    for name, dataset, modality, metrics in entries:
        row = by_model.setdefault((name, modality), {"modality": modality, "model": name,
                                                     **{d: dict(blank) for d, _ in SEQ_DATASETS}})
        row[dataset] = {
            "acc": _percent(metrics.get("single/acc")), "pmr": _percent(metrics.get("single/pmr")),
            "lq": _raw(metrics.get("single/lcs")), "lr": _raw(metrics.get("single/lcstr")),
            "tau": _raw(metrics.get("single/tau")), "dist": _raw(metrics.get("single/dist")),
        }
    for (name, modality), row in by_model.items():
        out[("wu2022", "Table 2")].append(dict(row, pretraining=DASH, _label={"model": f"{name} (ours)", "pretraining": ""}))
        if modality in ("image", "multimodal"):
            out[("wu2022", "Table 3")].append(dict(row, objectives=[], _label={"objectives": f"{name} (ours)"}))
    multi_ref: dict[tuple[str, str, str], dict] = {}
    for name, dataset, modality, metrics in entries:
        table = ("wu2022", "Table 10" if modality == "image" else "Table 4")
        for subset in ("single", "multi", "all"):
            row = multi_ref.setdefault((name, modality, subset), {
                "_table": table, "modality": modality, "model": name, "subset": subset, "human": False,
                "_label": {"subset": f"{_SUBSET.show[subset]} ({name}, ours)"},
                **{d: {m.key: NA for m in _MULTI_REF if not m.optional} for d, _ in SEQ_DATASETS}})
            cells = row[dataset]
            for short, key in (("acc", "acc"), ("pmr", "pmr"), ("lr", "lcstr")):
                scale = _raw if short == "lr" else _percent
                if subset == "single":
                    cells[f"{short}_single"], cells[f"{short}_multi"] = scale(metrics.get(f"subset_single/{key}")), DASH
                elif subset == "multi":
                    cells[f"{short}_single"] = scale(_multi_subset_single(metrics, key))
                    cells[f"{short}_multi"] = scale(metrics.get(f"subset_multi/{key}"))
                else:
                    cells[f"{short}_single"], cells[f"{short}_multi"] = scale(metrics.get(f"single/{key}")), scale(metrics.get(key))
    for row in multi_ref.values():
        out[row.pop("_table")].append(row)
    return out


def _teo_value(report: Mapping[str, Any], *keys: str) -> float | str:
    for key in keys:
        if _number(report.get(key)) is not None:
            return float(report[key])
    return NA


def teo_rows(results: Sequence[Mapping[str, Any]], runs: Sequence[tuple[str, str, str, Mapping[str, float]]] = ()
             ) -> dict[tuple[str, str], list[dict]]:
    """Our rows of MATEO Tables 3 (consistency accuracy) and 4 (per-class F1, image_text only).

    ``results``: eval_teo TEO results (every row, baselines included); ``runs``: train.py runs
    ``(name, strategy, modality, metrics)`` whose keys carry the ``teo_`` prefix, shown as fine-tuned.
    """
    table3: dict[tuple[str, str, bool], dict] = {}
    table4: dict[tuple[str, str, bool], dict] = {}
    reports = [(r["_path"], name, r["strategy"], r["modality"], report, False)
               for r in results for name, report in r["rows"].items()]
    reports += [(name, name, strategy, modality, {k.removeprefix("teo_"): v for k, v in metrics.items()}, True)
                for name, strategy, modality, metrics in runs]
    for source, name, strategy, modality, report, finetuned in reports:
        if strategy not in STRATEGIES or modality not in MODALITIES:
            raise SystemExit(f"{source}: strategy {strategy!r} / modality {modality!r} is not a MATEO column "
                             f"(strategies {', '.join(STRATEGIES)}; modalities {', '.join(MODALITIES)})")
        row = table3.setdefault((name, modality, finetuned), {
            "model": name, "modality": modality, "finetuned": finetuned, **{s: DASH for s in STRATEGIES}})
        row[strategy] = _teo_value(report, "consistency_accuracy")
        if modality == "image_text":
            for cls, keys in (("before", ("mateo_f1_before", "f1_before")), ("independent", ("mateo_f1_independent",)),
                              ("after", ("mateo_f1_after", "f1_after"))):
                row4 = table4.setdefault((name, cls, finetuned), {"model": name, "class": cls, "finetuned": finetuned,
                                                                  **{s: DASH for s in STRATEGIES}})
                row4[strategy] = _teo_value(report, *keys)
    return {("mateo", "Table 3"): [dict(r, model=f"{r['model']} (ours)") for r in table3.values()],
            ("mateo", "Table 4"): [dict(r, model=f"{r['model']} (ours)") for r in table4.values()]}


def iso_rows(results: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[dict]]:
    """Our rows of ISO-Bench Table 1: each result's system under both rules for unparsable replies
    (``exclude``, App. H, and ``wrong``; setting from its strategy), then the trivial baselines once
    (setting '-'; they always parse, so the rule does not change them)."""
    systems, baselines = [], {}
    for result in results:
        strategy = result["strategy"]
        if strategy not in ISO_SETTINGS:
            raise SystemExit(f"{result['_path']}: ISO strategy {strategy!r}, expected one of {', '.join(ISO_STRATEGIES)}")
        by_rule = result.get("rows_by_unparsable") or {result.get("unparsable", "exclude"): result["rows"]}
        for rule, rows in by_rule.items():
            _iso_system_rows(result, rule, rows, systems, baselines)
    return {("iso_bench", "Table 1"): systems + list(baselines.values())}


def _iso_system_rows(result: Mapping[str, Any], rule: str, rows: Mapping[str, Mapping[str, Any]],
                     systems: list[dict], baselines: dict[str, dict]) -> None:
    """Table 1 rows of one result under one rule: its model's row to ``systems``, the baselines' to
    ``baselines`` (each name once)."""
    for name, report in rows.items():
        own = name == result["model"]
        row = {"model": f"{name} (ours, unparsable={rule})" if own else f"{name} (ours)",
               "setting": ISO_SETTINGS[result["strategy"]] if own else DASH}
        for group, suffix in (("dep", "_DEP"), ("nondep", "_NONDEP")):
            row[group] = {m: _teo_value(report, f"{full}{suffix}") for m, full in
                          (("p", "precision"), ("r", "recall"), ("f", "f1"))}
        row["macro"] = {m: _teo_value(report, f"macro_{full}") for m, full in
                        (("p", "precision"), ("r", "recall"), ("f", "f1"))}
        if own:
            systems.append(row)
        else:
            baselines.setdefault(name, row)


def coherence_rows(results: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[dict]]:
    """Our rows of COHERENCE Tables 1 (per domain: ``by_source``) and 2 (per difficulty: ``by_difficulty``)."""
    out: dict[tuple[str, str], dict[str, dict]] = {("coherence", "Table 1"): {}, ("coherence", "Table 2"): {}}
    for result in results:
        for name, report in result["rows"].items():
            for table, breakdown, partial in (("Table 1", "by_source", "partial"), ("Table 2", "by_difficulty", "kendall")):
                spec = SPECS[("coherence", table)]
                parts = {str(k).lower(): v for k, v in (report.get(breakdown) or {}).items() if isinstance(v, Mapping)}
                row = {"group": "ours", "model": f"{name} (ours)"}
                for group, _ in spec.groups:
                    source = report if group == "overall" else parts.get(group, {})
                    row[group] = {"exact": _percent(_number(source.get("exact_match"))),
                                  partial: _percent(_number(source.get("partial_score")))}
                out[("coherence", table)].setdefault(name, row)
    return {key: list(rows.values()) for key, rows in out.items()}


# ---------------------------------------------------------------- CaT-Bench
CATBENCH_SYSTEMS = (("catbench", "{name} (ours)"), ("lr_baseline", "logistic regression, frozen MiniLM (ours)"),
                    ("always_yes", "always yes (ours)"), ("always_no", "always no (ours)"))
"""Metric-key prefix of each row a CaT-Bench run logs (``test/<prefix>_<metric>``) and its row name."""
_CATBENCH_KEYS = {"p": "precision_yes", "r": "recall_yes", "f1": "f1_yes", "acc": "accuracy", "macro_f1": "macro_f1"}


def parse_catbench_spec(spec: str) -> tuple[str, Path]:
    """``NAME=PATH`` (a CaT-Bench run's test metrics) -> (name, path)."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise SystemExit(f"--catbench {spec!r}: expected NAME=PATH (PATH: a run's test_metrics.json or log)")
    return name, Path(path)


def catbench_rows(runs: Sequence[tuple[str, Mapping[str, float]]]) -> dict[tuple[str, str], list[dict]]:
    """Our rows of CaT-Bench Table 2 from runs' test metrics (``catbench_*`` = the run's model, then the
    logistic-regression baseline and the trivial rows when the run logged them, each once); setting '-'."""
    rows: dict[str, dict] = {}
    for name, metrics in runs:
        found = False
        for prefix, title in CATBENCH_SYSTEMS:
            if f"{prefix}_f1_yes" not in metrics:
                continue
            found = True
            model = title.format(name=name)
            rows.setdefault(model, {"model": model, "setting": DASH,
                                    **{col: _raw(_number(metrics.get(f"{prefix}_{key}"))) for col, key in _CATBENCH_KEYS.items()}})
        if not found:
            raise SystemExit(f"--catbench {name}: the metrics hold no CaT-Bench scores (no 'catbench_f1_yes')")
    return {("catbench", "Table 2"): list(rows.values())}
