"""LoRA fine-tuning of InternVL for Temporal Execution Order (MATEO recipe).

The network is built from the module's own hyper-parameters (``name_or_path: tiny`` -> the tiny
random InternVL of :mod:`seqaware.vlm.models`; ``tiny-minilm`` -> the small InternVL around the
pretrained MiniLM decoder; anything else -> the real checkpoint through
:func:`seqaware.vlm.models.load_internvl`), wrapped with PEFT LoRA, and trained with the causal LM loss
on the answer tokens only (the data module puts ``-100`` everywhere else).

* What trains: ``train_parts`` sets each part (vision tower, projector, language model) to ``frozen``,
  ``lora`` or ``full`` and ``lora.layers`` which Linear layers of a ``lora`` part get adapters
  (:mod:`seqaware.vlm.trainable`). Default: LoRA (r 16, alpha 32) on the language model's q/k/v/o
  projections only (MATEO appendix A.1), everything else frozen. The old ``lora.target`` bundles
  (``language``, ``language_vision``, ``all_linear``) are read as the parts they meant.
* Images are cut into at most ``image_tiles`` tiles (``data.image_tiles``; :mod:`seqaware.vlm.inputs`).
* Validation / test: greedy generation on the original + swapped pairs, parsed with
  :func:`seqaware.vlm.parser.parse_teo_answer`, scored with :func:`seqaware.metrics.teo.teo_report` and
  logged as ``val/teo_consistency_accuracy``, ``val/teo_macro_f1``, ... (``test/...``).
* Checkpoints hold only the trainable (LoRA) parameters: the frozen base is rebuilt from the config
  when a checkpoint is loaded (``load_from_checkpoint`` works), so a checkpoint of the 8B recipe is
  a few tens of MB, not 16 GB.
* At the end of ``fit`` the adapter is written in PEFT format to ``adapter_dir`` (default: the run
  folder's ``adapter/``; loadable with ``PeftModel.from_pretrained``), from the best checkpoint of
  the monitored ``ModelCheckpoint`` when there is one, else from the final weights, with the processor
  and ``seqaware_inputs.json`` (the tiling, the training prompt, the base model), so that
  ``scripts/tools/eval_teo.py --model <adapter_dir>`` builds the inputs training built. With
  ``merge_adapter: true`` the merged full model (+ processor + record) also goes to ``adapter_dir/merged``.
  With no ``lora`` part there is no adapter: the trained model is saved whole to ``adapter_dir``.
"""
from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import torch

from seqaware.metrics.teo import complete_pairs, teo_report
from seqaware.modules.base import SeqawareModule, as_container, gather_unique
from seqaware.runs import best_checkpoint
from seqaware.vlm import parse_teo_answer
from seqaware.vlm.inputs import DEFAULT_IMAGE_TILES, apply_tiling, check_image_tiles, write_record
from seqaware.vlm.models import BUILT_IN_MODELS, answer_loss, load_internvl
from seqaware.vlm.trainable import apply_train_parts, resolve_train_parts

log = logging.getLogger(__name__)

REPORT_KEYS = ("consistency_accuracy", "consistency_dependent", "consistency_independent", "f1_before",
               "f1_after", "f1_independent", "macro_f1", "mateo_f1_before", "mateo_f1_independent", "mateo_f1_after", "other_rate",
               "accuracy_original", "accuracy_swapped")


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"model.dtype must be a torch dtype name (float32, bfloat16, float16), got {name!r}")
    return value


class TeoLoraModule(SeqawareModule):
    """InternVL + PEFT LoRA for TEO (see the module docstring).

    Args:
        name_or_path: ``tiny``, ``tiny-minilm`` or an InternVL checkpoint in the HF format (``OpenGVLab/InternVL3_5-8B-HF``).
        tiny: architecture overrides of the built-in models (``tiny``: ``text_hidden``, ``text_layers``, ...;
            ``tiny-minilm``: ``vision_*`` sizes and ``head_scale``).
        init_seed: seed of the tiny model's random initialisation (the frozen base is rebuilt from it).
        dtype: weight dtype of the base model (``bfloat16`` on GPU; LoRA weights are kept in float32).
        attn_implementation: attention kernel of real checkpoints (``sdpa``, ``flash_attention_2``, ``eager``).
        train_parts: ``{vision, projector, language}``, each ``frozen|lora|full`` (None: the language model
            under LoRA, or the parts of an old ``lora.target``; :mod:`seqaware.vlm.trainable`).
        lora: ``{r, alpha, dropout, layers: attention|all_linear, bias}``.
        gradient_checkpointing: recompute activations in the backward pass (saves memory on GPU).
        strategy: prompt strategy whose answers are parsed (must match ``data.strategy``).
        prompt: the prompt the data shows (``data.prompt``), recorded with the adapter.
        image_tiles: the data's tiling (``data.image_tiles``), recorded with the adapter and set as the
            saved processor's default; a fit with a data module of another tiling is refused.
        max_new_tokens: generation budget of an answer (MATEO's ``Q1: The answer is: Yes.`` x 3 lines is ~30 tokens).
        adapter_dir: where the PEFT adapter is saved at the end of fit (None: ``<run folder>/adapter``).
        merge_adapter: also save the merged full model to ``adapter_dir/merged``.
        optimizer / scheduler: see :class:`~seqaware.modules.base.SeqawareModule`.

    Train mode: the whole network, frozen base included, is in train mode during fit, as PEFT and
    the Hugging Face Trainer do (the base's weights are frozen by ``requires_grad``, not by eval
    mode); no module is kept in eval mode.  The built-in bases have no dropout (``tiny-minilm``
    sets MiniLM's to 0, like the Qwen decoders of the real recipe) so only the LoRA dropout acts;
    train mode also makes ``gradient_checkpointing`` take effect on a base loaded by
    ``from_pretrained`` (which returns it in eval mode).
    """

    half_precision_ready = True  # trainer.precision=bf16-true (float32 master weights): tests/test_master_weights.py
    monitor = "val/teo_consistency_accuracy"   # the best checkpoint: consistency accuracy on the validation pairs
    monitor_mode = "max"

    def __init__(self, name_or_path: str = "tiny", tiny: dict | None = None, init_seed: int = 0, dtype: str = "float32",
                 attn_implementation: str | None = "sdpa", lora: dict | None = None, gradient_checkpointing: bool = False,
                 strategy: str = "instructions", max_new_tokens: int = 40, adapter_dir: str | None = None,
                 merge_adapter: bool = False, optimizer: dict | None = None, scheduler: dict | None = None,
                 train_parts: dict | None = None, prompt: str = "finetune", image_tiles: int = DEFAULT_IMAGE_TILES):
        super().__init__()
        resolve_train_parts(as_container(train_parts), as_container(lora))  # bad keys fail here, naming them
        check_image_tiles(image_tiles, "model.image_tiles")
        self.save_hyperparameters({
            "name_or_path": name_or_path, "tiny": as_container(tiny), "init_seed": init_seed, "dtype": dtype,
            "attn_implementation": attn_implementation, "lora": as_container(lora), "gradient_checkpointing": gradient_checkpointing,
            "train_parts": as_container(train_parts), "prompt": prompt, "image_tiles": image_tiles,
            "strategy": strategy, "max_new_tokens": max_new_tokens, "adapter_dir": adapter_dir,
            "merge_adapter": merge_adapter, "optimizer": as_container(optimizer) or {"_target_": "torch.optim.AdamW", "lr": 1e-4},
            "scheduler": as_container(scheduler),
        })
        self.model, self.processor = self._build(name_or_path, tiny or {}, init_seed, dtype, attn_implementation,
                                                 as_container(train_parts), lora or {})
        apply_tiling(self.processor, image_tiles)
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.model.config.use_cache = False
        # checkpoints hold the trainable parameters only (see on_save_checkpoint / on_load_checkpoint)
        self.strict_loading = False
        self._eval_buffer: list[dict[str, Any]] = []
        self.test_predictions: list[dict[str, Any]] | None = None

    @staticmethod
    def _build(name: str, tiny: dict, seed: int, dtype: str, attn: str | None, train_parts: dict | None,
               lora: dict) -> tuple[Any, Any]:
        if name in BUILT_IN_MODELS:
            base, processor = BUILT_IN_MODELS[name][0](seed, **tiny)
            base = base.to(_dtype(dtype))
        else:
            base, processor = load_internvl(name, dtype=_dtype(dtype), attn_implementation=attn)
        return apply_train_parts(base, train_parts, lora), processor

    @property
    def is_peft(self) -> bool:
        """Whether the network is a PEFT model (some part under LoRA) rather than the plain InternVL."""
        return hasattr(self.model, "get_base_model")

    def base_model(self) -> Any:
        """The InternVL inside the PEFT wrapper (the network itself when no part is under LoRA)."""
        return self.model.get_base_model() if self.is_peft else self.model

    def setup(self, stage: str) -> None:
        """Refuse a data module whose tiling or prompt differs from the one this module records."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        for key in ("image_tiles", "prompt"):
            theirs = getattr(datamodule, key, None)
            if theirs is not None and theirs != self.hparams.get(key):
                raise ValueError(f"model.{key}={self.hparams.get(key)!r} but data.{key}={theirs!r}: the saved adapter "
                                 f"would record inputs it was not trained on; set data.{key} (model.{key} follows it)")

    # ------------------------------------------------------------------ training
    def _inputs(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        if "pixel_values" in batch:
            vision = self.base_model().model.vision_tower
            inputs["pixel_values"] = batch["pixel_values"].to(next(vision.parameters()).dtype)
        return inputs

    def forward(self, batch: dict[str, Any]) -> Any:
        return self.model(**self._inputs(batch), labels=batch.get("labels"))

    def answer_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        """``self(batch).loss`` without the ``(B, T, vocabulary)`` logits (:func:`seqaware.vlm.models.answer_loss`)."""
        return answer_loss(self.model, self._inputs(batch), batch["labels"])

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = self.answer_loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    # ---------------------------------------------------------------- evaluation
    @torch.no_grad()
    def generate_answers(self, batch: dict[str, Any]) -> list[str]:
        """Greedy answers (decoded text after the prompt) for a left-padded prompt batch."""
        inputs = self._inputs(batch)
        out = self.model.generate(**inputs, max_new_tokens=self.hparams.max_new_tokens, do_sample=False,
                                  use_cache=True)
        new = out[:, inputs["input_ids"].shape[1]:]
        return self.processor.tokenizer.batch_decode(new, skip_special_tokens=True)

    def _eval_step(self, batch: dict[str, Any]) -> None:
        answers = self.generate_answers(batch)
        for pair, text in zip(batch["pairs"], answers):
            self._eval_buffer.append({
                "pair_id": pair["pair_id"], "procedure_id": pair["procedure_id"], "set": pair["set"],
                "a": pair["a"], "b": pair["b"], "label": pair["label"],
                "pred": parse_teo_answer(text, self.hparams.strategy), "output": text,
            })

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch)

    def on_validation_epoch_start(self) -> None:
        self._eval_buffer = []

    def on_test_epoch_start(self) -> None:
        self._eval_buffer = []

    def _gathered(self) -> list[dict[str, Any]]:
        """This epoch's records from every rank, each (set, pair_id) once (samplers pad by repeats)."""
        return gather_unique(self._eval_buffer, key=lambda r: (r["set"], r["pair_id"]))

    def validation_metrics(self) -> list[str]:
        """``val/teo_<key>`` of every :data:`REPORT_KEYS` and ``val/teo_num_pairs`` (:meth:`_report`)."""
        return [*(f"val/teo_{k}" for k in REPORT_KEYS), "val/teo_num_pairs"]

    def _report(self, stage: str) -> dict[str, float]:
        records = self._gathered()
        self._eval_buffer = []
        # limit_*_batches may cut a pair's swapped twin off: score complete pairs only
        original, swapped = complete_pairs([r for r in records if r["set"] == "original"],
                                           [r for r in records if r["set"] == "swapped"])
        keep = {r["pair_id"] for r in original + swapped}
        if not original:
            raise RuntimeError(f"{stage}: no complete original+swapped TEO pair was evaluated; "
                               "evaluate more batches (the loader interleaves each pair with its swapped twin)")
        report = teo_report(original, swapped, {r["pair_id"]: r["pred"] for r in original},
                            {r["pair_id"]: r["pred"] for r in swapped})
        values = {f"{stage}/teo_{k}": float(report[k]) for k in REPORT_KEYS}
        values[f"{stage}/teo_num_pairs"] = float(report["num_pairs"])
        self.log_dict(values, sync_dist=False)
        if stage == "test":
            self.test_predictions = [r for r in records if r["pair_id"] in keep]
        return values

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:
            self._eval_buffer = []
            return
        self._report("val")

    def on_test_epoch_end(self) -> None:
        self._report("test")

    # --------------------------------------------------------------- checkpoints
    def _trainable_names(self) -> set[str]:
        return {name for name, p in self.named_parameters() if p.requires_grad}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        trainable = self._trainable_names()
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        saved, expected = set(checkpoint["state_dict"]), self._trainable_names()
        if saved != expected:
            missing, extra = sorted(expected - saved)[:5], sorted(saved - expected)[:5]
            raise ValueError(f"checkpoint does not hold this model's LoRA parameters (missing e.g. {missing}, "
                             f"unexpected e.g. {extra}): was it trained with the same model.train_parts and "
                             "model.lora settings?")
        hyper = checkpoint.get("hyper_parameters")
        if hyper is not None and "image_tiles" not in hyper:
            # saved before data.image_tiles existed: its training fed every image as one tile
            self.hparams["image_tiles"] = 1
            apply_tiling(self.processor, 1)
            log.info("checkpoint from before data.image_tiles: it was trained on one tile per image (image_tiles=1)")

    # ------------------------------------------------------------------- adapter
    def adapter_path(self) -> Path:
        """Where :meth:`save_adapter` writes (``adapter_dir`` or ``<trainer.default_root_dir>/adapter``)."""
        if self.hparams.adapter_dir:
            return Path(self.hparams.adapter_dir)
        return Path(self.trainer.default_root_dir) / "adapter"

    def inputs_record(self) -> dict[str, Any]:
        """What ``seqaware_inputs.json`` says beside a saved model: how its inputs were built (tiling, prompt,
        strategy) and which base it adapts (name, seed and sizes of a built-in one, dtype)."""
        h = self.hparams
        return {"image_tiles": h.image_tiles, "prompt": h.prompt, "strategy": h.strategy, "base_model": h.name_or_path,
                "init_seed": h.init_seed, "tiny": h.tiny or {}, "dtype": h.dtype,
                "train_parts": resolve_train_parts(h.get("train_parts"), h.lora)[0]}

    def save_adapter(self, path: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
        """Save the LoRA adapter in PEFT format (``adapter_config.json`` + ``adapter_model.safetensors``),
        the processor and ``seqaware_inputs.json`` (:meth:`inputs_record`); with ``merge_adapter`` the
        merged model, processor and record in ``merged/``. Without a LoRA part the model is saved whole.

        ``state_dict``: this module's trainable parameters to save instead of the current ones (keys
        as in a checkpoint, ``model.base_model.model...``).
        """
        path = Path(path)
        kwargs = {}
        if state_dict is not None:
            kwargs["state_dict"] = {k[len("model."):]: v for k, v in state_dict.items() if k.startswith("model.")}
        if not self.is_peft:  # no adapter: the trained model itself, loadable by from_pretrained
            model = self.model
            if state_dict is not None:
                model = copy.deepcopy(self.model)
                model.load_state_dict(kwargs["state_dict"], strict=False)
            model.save_pretrained(str(path))
        else:
            self.model.save_pretrained(str(path), **kwargs)
        folders = [path]
        if self.hparams.merge_adapter and self.is_peft:
            merged = copy.deepcopy(self.model)
            if state_dict is not None:
                merged.load_state_dict(kwargs["state_dict"], strict=False)
            merged = merged.merge_and_unload()
            merged.save_pretrained(str(path / "merged"))
            folders.append(path / "merged")
        for folder in folders:
            self.processor.save_pretrained(str(folder))
            write_record(folder, self.inputs_record())
        return path

    def on_fit_end(self) -> None:
        if self.trainer.fast_dev_run:
            return
        best = best_checkpoint(self.trainer)
        state = None
        if best is not None:
            state = torch.load(best, map_location="cpu", weights_only=True)["state_dict"]
        if self.trainer.is_global_zero:
            path = self.save_adapter(self.adapter_path(), state)
            log.info("saved the LoRA adapter (%s) to %s", f"best checkpoint {best}" if best else "final weights", path)
