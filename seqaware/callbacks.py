"""Lightning callbacks of the project."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytorch_lightning as pl

from seqaware.io import atomic_open
from seqaware.reports import bar_chart, markdown_table, per_category

log = logging.getLogger(__name__)


class CategoryReport(pl.Callback):
    """After testing, write the per-category metrics of the test predictions.

    Files in ``output_dir``: ``category_report.md`` / ``.json`` and ``category_pmr.png`` (a bar
    chart of per-category PMR).  With a W&B logger attached, the table and the chart are logged
    too.  Runs on rank 0 only; does nothing for modules without ``test_predictions``.
    """

    def __init__(self, output_dir: str, level: int = 1, metric: str = "pmr"):
        self.output_dir = Path(output_dir)
        self.level = int(level)
        self.metric = metric

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        records = getattr(pl_module, "test_predictions", None)
        if not trainer.is_global_zero or not records or "references" not in records[0]:
            return  # only ordering predictions (pred + references) have a per-category ordering report
        table = per_category(records, self.level)
        label = getattr(pl_module.hparams, "get", lambda *_: None)("modality") or "model"
        with atomic_open(self.output_dir / "category_report.json") as fh:
            json.dump(table, fh, indent=1)
        with atomic_open(self.output_dir / "category_report.md") as fh:
            fh.write(markdown_table(table))
        chart = bar_chart({label: table}, self.output_dir / f"category_{self.metric}.png", self.metric)
        log.info("per-category report written to %s", self.output_dir)
        for lg in trainer.loggers:
            if type(lg).__name__ == "WandbLogger":
                import wandb

                columns = ["category", "n", "pmr", "acc", "tau", "dist", "lcs", "lcstr"]
                rows = [[name, row["n"]] + [row[c] for c in columns[2:]] for name, row in table.items()]
                lg.experiment.log({"test/category_table": wandb.Table(columns=columns, data=rows),
                                   f"test/category_{self.metric}": wandb.Image(str(chart))})
