"""TEO fine-tuning data: procedures -> TEO pairs -> InternVL chat batches with answer-only labels.

Pairs come from :mod:`data_modules.tasks.teo` (MATEO construction):

* train: :func:`~data_modules.tasks.teo.teo_training_pairs` -- dependent pairs in both
  presentations (``before`` and ``after`` exactly balanced), independent pairs once;
* val / test: :func:`~data_modules.tasks.teo.teo_eval_sets` -- the ``original`` set followed by the
  ``swapped`` set (each pair carries ``set``), so the module can score consistency accuracy.

Each pair becomes a chat prompt + target from ``configs/prompts/teo.yaml`` (one home for the wording):

* ``prompt: finetune`` (default) -- MATEO's fine-tuning prompt (appendix A.1 Table 6, the Instructions
  task of section 5.4: :func:`~seqaware.vlm.prompts.build_teo_finetune_prompt`); ``prompt: eval`` -- the
  evaluation prompt of ``strategy`` (Table 5, :func:`~seqaware.vlm.prompts.build_teo_prompt`), a
  seqaware option;
* ``target_format: mateo`` (default) -- Table 6's answer ``"Q1: The answer is: Yes.\\nQ2: The answer
  is: No.\\nQ3: The answer is: No."``; ``short`` -- seqaware's earlier ``"Q1: Yes\\nQ2: No\\nQ3: No"``
  (:func:`~seqaware.vlm.prompts.teo_answer`).

:class:`TeoChatCollator` renders prompt (+ answer) with the processor's chat template and runs the
processor once per batch. Training batches are right-padded and carry ``labels`` equal to
``input_ids`` on the assistant answer tokens (answer + ``<|im_end|>`` + the template's newline)
and ``-100`` everywhere else (system, user prompt, image tokens, padding). Evaluation batches hold
the left-padded prompts only (for ``generate``) plus the pair records.

:class:`~data_modules.sampling.LengthBucketBatchSampler` groups training pairs of similar length into micro-batches
(``mateo_fast``): less padding, same data per epoch, order a pure function of (seed, epoch).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from data_modules.images import ImageLoadError, check_procedure_images, open_rgb
from data_modules.sampling import KeyedList, SplitLoaders, epoch_loader
from data_modules.tasks.teo import (stratified_split, teo_class_counts, teo_eval_sets, teo_options, teo_training_pairs,
                                   twin_presentations)
from seqaware.procedure import Procedure, ProcedureFormatError, resolve_path
from seqaware.vlm.inputs import DEFAULT_IMAGE_TILES, check_image_tiles, tiling_kwargs
from seqaware.vlm.prompts import (MODALITIES, QUESTION_STRATEGIES, TEO_TARGET_FORMATS, build_teo_finetune_prompt,
                                  build_teo_prompt, teo_answer)

log = logging.getLogger(__name__)

IGNORE_INDEX = -100


def resolve_pair_images(pair: dict[str, Any], root: str | None) -> dict[str, Any]:
    """A copy of ``pair`` whose step image paths are absolute (resolved against the procedures folder)."""
    out = dict(pair)
    for key in ("step_a", "step_b"):
        step = dict(pair[key])
        step["images"] = [str(resolve_path(p, root)) for p in step.get("images") or []]
        out[key] = step
    return out


def pair_length(pair: dict[str, Any], modality: str) -> int:
    """A length proxy for bucketing: characters of the shown step texts (+ a fixed cost per image).

    The prompt template is the same for every pair, so the variable part of the sequence length is
    the step descriptions (text modalities) and the number of shown images (a fixed cost each: the
    tiles an image gets depend on its aspect ratio, and the images of a data set mostly share one).
    """
    length = 0
    if modality in ("text", "image_text"):
        length += len(pair["step_a"].get("text") or "") + len(pair["step_b"].get("text") or "")
    if modality in ("image", "image_text"):
        length += 1000 * (bool(pair["step_a"].get("images")) + bool(pair["step_b"].get("images")))
    return length


PROMPTS = ("finetune", "eval")


def check_prompt_options(modality: str, strategy: str, prompt: str, target_format: str) -> None:
    """ValueError naming the data option when the modality / strategy / prompt / target format do not fit."""
    if modality not in MODALITIES:
        raise ValueError(f"data.modality must be one of {MODALITIES}, got {modality!r}")
    if strategy not in QUESTION_STRATEGIES:
        raise ValueError(f"data.strategy must be a Yes/No question strategy {QUESTION_STRATEGIES}, got {strategy!r}")
    if prompt not in PROMPTS:
        raise ValueError(f"data.prompt must be one of {PROMPTS}, got {prompt!r}")
    if prompt == "finetune" and strategy != "instructions":
        raise ValueError(f"data.prompt=finetune is MATEO's fine-tuning prompt (Table 6, the Instructions prompt): "
                         f"it needs data.strategy=instructions, got {strategy!r} (or set data.prompt=eval)")
    if target_format not in TEO_TARGET_FORMATS:
        raise ValueError(f"data.target_format must be one of {TEO_TARGET_FORMATS}, got {target_format!r}")


class TeoChatCollator:
    """Pairs -> processor outputs (see the module docstring for padding and labels).

    Args:
        processor: an InternVL processor (``apply_chat_template`` + ``__call__``).
        modality: ``image`` | ``text`` | ``image_text`` (which step contents the prompt shows).
        strategy: a question strategy (``instructions`` by default): with ``prompt=eval`` its Table 5 prompt
            is shown; with ``prompt=finetune`` it must be ``instructions`` (Table 6 is that prompt).
        prompt: ``finetune`` (MATEO Table 6, default) or ``eval`` (the Table 5 prompt of ``strategy``).
        target_format: ``mateo`` (Table 6's ``Qk: The answer is: Yes/No.`` lines, default) or ``short``.
        train: True -> prompt + answer with labels (right padding); False -> prompt only (left padding).
        max_length: optional cap on the sequence length; a longer example raises a clear error
            (truncating would cut the answer).
        prompts_dir: folder of the prompt YAML files (default ``configs/prompts``).
        image_tiles: at most this many tiles per image (:mod:`seqaware.vlm.inputs`: 1 = one tile,
            12 = InternVL's dynamic tiling + a thumbnail, the default), passed to the processor on every call.
    """

    def __init__(self, processor: Any, modality: str = "image_text", strategy: str = "instructions",
                 train: bool = True, max_length: int | None = None, prompts_dir: str | None = None,
                 prompt: str = "finetune", target_format: str = "mateo", image_tiles: int = DEFAULT_IMAGE_TILES):
        check_prompt_options(modality, strategy, prompt, target_format)
        self.image_tiles = check_image_tiles(image_tiles)
        self.processor = processor
        self.modality, self.strategy, self.train = modality, strategy, train
        self.prompt, self.target_format = prompt, target_format
        self.max_length = max_length
        self.prompts_dir = prompts_dir

    def _step(self, pair: dict[str, Any], key: str) -> dict[str, Any]:
        step = pair[key]
        out: dict[str, Any] = {"text": step.get("text"), "image": None}
        if self.modality in ("image", "image_text"):
            images = step.get("images") or []
            if not images:
                raise ValueError(f"TEO pair {pair['pair_id']}: field {key}.images is empty but data.modality="
                                 f"{self.modality} shows step pictures")
            try:
                out["image"] = open_rgb(images[0])
            except ImageLoadError as err:
                raise ImageLoadError(f"TEO pair {pair['pair_id']}, field {key}.images[0]: {err}") from err
        return out

    def messages(self, pair: dict[str, Any], with_answer: bool) -> list[dict[str, Any]]:
        """Chat messages of one pair: the prompt, plus the assistant answer when ``with_answer``."""
        step_a, step_b = self._step(pair, "step_a"), self._step(pair, "step_b")
        try:
            if self.prompt == "finetune":
                msgs = build_teo_finetune_prompt(self.modality, step_a, step_b, prompts_dir=self.prompts_dir)
            else:
                msgs = build_teo_prompt(self.strategy, self.modality, step_a, step_b, prompts_dir=self.prompts_dir)
        except ValueError as err:
            raise ValueError(f"TEO pair {pair.get('pair_id')}: {err}") from err
        if with_answer:
            try:
                answer = teo_answer(pair["label"], self.target_format, prompts_dir=self.prompts_dir)
            except ValueError as err:
                raise ValueError(f"TEO pair {pair.get('pair_id')}, field label: {err}") from err
            msgs = msgs + [{"role": "assistant", "content": [{"type": "text", "text": answer}]}]
        return msgs

    def _encode(self, texts: list[str], images: list[Any], padding_side: str) -> dict[str, torch.Tensor]:
        out = self.processor(text=texts, images=images or None, padding=True, padding_side=padding_side,
                             return_tensors="pt", images_kwargs=tiling_kwargs(self.image_tiles))
        batch = {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
        if self.max_length is not None and batch["input_ids"].shape[1] > self.max_length:
            raise ValueError(f"a TEO example has {batch['input_ids'].shape[1]} tokens > data.max_length={self.max_length}")
        return batch

    def __call__(self, pairs: list[dict[str, Any]]) -> dict[str, Any]:
        proc = self.processor
        convs = [self.messages(p, with_answer=self.train) for p in pairs]
        images = [item["image"] for conv in convs for m in conv for item in m["content"] if item["type"] == "image"]
        prompts = [proc.apply_chat_template(c if not self.train else c[:-1], tokenize=False, add_generation_prompt=True)
                   for c in convs]
        if not self.train:
            batch = self._encode(prompts, images, "left")
            batch["pairs"] = pairs
            return batch
        full = [proc.apply_chat_template(c, tokenize=False) for c in convs]
        answers = []
        for pair, prompt, text in zip(pairs, prompts, full):
            if not text.startswith(prompt):
                raise ValueError(f"TEO pair {pair['pair_id']}: the chat template does not render the conversation "
                                 "as prompt + answer; cannot mask the prompt tokens")
            answers.append(text[len(prompt):])
        batch = self._encode(full, images, "right")
        ids, mask = batch["input_ids"], batch["attention_mask"]
        answer_ids = proc.tokenizer(answers, add_special_tokens=False)["input_ids"]
        n_answer = torch.tensor([len(a) for a in answer_ids])
        ends = mask.sum(dim=1)
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        keep = (pos >= (ends - n_answer).unsqueeze(1)) & (pos < ends.unsqueeze(1))
        labels = torch.where(keep, ids, torch.full_like(ids, IGNORE_INDEX))
        # the answer tokens must be exactly the tail of the sequence (tokenisation splits at the prompt end)
        for row, (pair, expect) in enumerate(zip(pairs, answer_ids)):
            if labels[row][keep[row]].tolist() != expect:
                raise ValueError(f"TEO pair {pair['pair_id']}: the answer tokens are not the tail of the tokenised "
                                 "conversation; cannot place the labels")
        batch["labels"] = labels
        batch["pairs"] = pairs
        return batch


class TeoPairsDataModule(SplitLoaders, pl.LightningDataModule):
    """TEO fine-tuning data module (see the module docstring).

    Args:
        source: callable returning ``{split: [Procedure]}`` (``data_modules.sources``: synthetic or JSONL).
        processor: the model's processor (``apply_chat_template`` + ``__call__``), or a callable without
            arguments that builds it on first use: ``configs/data/teo_pairs.yaml`` gives
            :func:`seqaware.vlm.models.load_processor` of ``${model.name_or_path}`` (Hydra ``_partial_``).
            This module builds no model part itself; without a processor only ``setup`` works.
        modality: ``image`` | ``text`` | ``image_text``.
        strategy: the prompt strategy (``instructions``; with ``prompt=eval`` any Yes/No strategy).
        prompt: ``finetune`` (MATEO Table 6, default) | ``eval`` (Table 5 prompt of ``strategy``).
        target_format: ``mateo`` (Table 6 answer lines, default) | ``short`` (``Q1: Yes`` ...).
        image_tiles: at most this many tiles per image (:mod:`seqaware.vlm.inputs`; default 12, InternVL's
            dynamic tiling + a thumbnail; 1: each image resized to one tile).
        resplit: optional ``[train, val, test]`` fractions: pool all procedures and re-split them with
            :func:`~data_modules.tasks.teo.stratified_split` (stratified by number of steps).
        batch_size / eval_batch_size: micro-batch sizes (training / generation).
        bucket_by_length: group training micro-batches by length (:class:`~data_modules.sampling.LengthBucketBatchSampler`).
        bucket_factor: batches per sorting window of the bucketing sampler.
        max_length: optional sequence length cap (a longer example is an error).
        max_train_pairs / max_eval_pairs: optional caps (first pairs after the seeded shuffle /
            first original pairs), for quick runs.
        num_workers, pin_memory, persistent_workers: DataLoader settings.
        seed: pair shuffling, split and sampler seed.
        teo: ``{pairs: edges | reduction}``: which DAG edges give ``before`` pairs
            (:func:`data_modules.tasks.teo.teo_pairs`; ``edges``, every annotated edge, is MATEO sec. 5.2).
        train_path / val_path / test_path: passed on to file-based sources (``data=jsonl``-style).
        allow_outside_images, verify_images, image_check_cache: image checks before the first step,
            as in :class:`data_modules.datamodule.ProcedureDataModule` (decoding only when the
            modality shows images).
    """

    def __init__(self, source: Callable[..., dict[str, list[Procedure]]], processor: Any = None,
                 modality: str = "image_text", strategy: str = "instructions", resplit: Sequence[float] | None = None,
                 batch_size: int = 1, eval_batch_size: int = 8, bucket_by_length: bool = False, bucket_factor: int = 50,
                 max_length: int | None = None, max_train_pairs: int | None = None, max_eval_pairs: int | None = None,
                 num_workers: int = 0, pin_memory: bool = False, persistent_workers: bool = False, seed: int = 0,
                 train_path: str | None = None, val_path: str | None = None, test_path: str | None = None,
                 prompts_dir: str | None = None, prompt: str = "finetune", target_format: str = "mateo",
                 allow_outside_images: bool = False, verify_images: bool = True, image_check_cache: str | None = None,
                 teo: Mapping[str, Any] | None = None, image_tiles: int = DEFAULT_IMAGE_TILES):
        super().__init__()
        check_prompt_options(modality, strategy, prompt, target_format)
        self.image_tiles = check_image_tiles(image_tiles)
        self.pair_rule = teo_options(teo)
        self.prompt, self.target_format = prompt, target_format
        self.image_checks = {"allow_outside": allow_outside_images, "cache_dir": image_check_cache,
                             "decode": verify_images and modality in ("image", "image_text")}
        self.source = source
        self._processor_source = processor
        self.modality, self.strategy = modality, strategy
        self.resplit = list(resplit) if resplit is not None else None
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        self.bucket_by_length, self.bucket_factor = bucket_by_length, int(bucket_factor)
        self.max_length = max_length
        self.max_train_pairs, self.max_eval_pairs = max_train_pairs, max_eval_pairs
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.persistent_workers = persistent_workers and num_workers > 0
        self.seed = int(seed)
        self.prompts_dir = prompts_dir
        self.source_paths = {k: v for k, v in
                             {"train_path": train_path, "val_path": val_path, "test_path": test_path}.items() if v is not None}
        self.datasets: dict[str, KeyedList] = {}
        self._processor = None

    @property
    def processor(self) -> Any:
        """The processor given to the module (built by its factory on first use)."""
        if self._processor is None:
            given = self._processor_source
            if given is None:
                raise ValueError("data.processor is not set: the TEO pairs need the model's processor "
                                 "(configs/data/teo_pairs.yaml builds it from model.name_or_path)")
            self._processor = given if hasattr(given, "apply_chat_template") else given()
        return self._processor

    def collator(self, train: bool) -> TeoChatCollator:
        return TeoChatCollator(self.processor, self.modality, self.strategy, train=train, max_length=self.max_length,
                               prompts_dir=self.prompts_dir, prompt=self.prompt, target_format=self.target_format,
                               image_tiles=self.image_tiles)

    def _read_source(self) -> dict[str, list[Procedure]]:
        return self.source(**self.source_paths)

    def prepare_data(self) -> None:
        self._read_source()  # generate / convert / cache once, on rank 0

    def _splits(self) -> dict[str, list[Procedure]]:
        splits = self._read_source()
        if self.resplit is None:
            return splits
        pooled = [p for procs in splits.values() for p in procs]
        return stratified_split(pooled, self.resplit, seed=self.seed)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        splits = self._splits()
        problems, _ = check_procedure_images([p for procs in splits.values() for p in procs], **self.image_checks)
        if problems:
            raise ProcedureFormatError(problems)
        for split, procs in splits.items():
            roots = {p.id: p.root for p in procs}
            if split == "train":
                pairs = [dict(p, set="train") for p in
                         teo_training_pairs(procs, seed=self.seed, pairs=self.pair_rule)[: self.max_train_pairs]]
            else:
                # each original pair directly followed by its swapped twin: any prefix of the loader
                # (limit_val_batches, fast_dev_run) holds complete pairs for consistency accuracy
                pairs = [dict(p, set=name) for name, p in twin_presentations(teo_eval_sets(procs, self.pair_rule),
                                                                                 self.max_eval_pairs)]
            pairs = [resolve_pair_images(p, roots[p["procedure_id"]]) for p in pairs]
            self.datasets[split] = KeyedList(pairs, name=f"{split} TEO pairs")
            log.info("TEO %s pairs: %d %s", split, len(pairs), teo_class_counts(pairs))

    def _dataset(self, split: str) -> KeyedList:
        if split not in self.datasets:
            raise ValueError(f"the data source gave no '{split}' split (it has {sorted(self.datasets)})")
        if len(self.datasets[split]) == 0:
            raise ValueError(f"the '{split}' split has no TEO pairs (do its procedures have a 'dag'?)")
        return self.datasets[split]

    def _loader(self, split: str, shuffle: bool, batch_size: int) -> DataLoader:
        dataset, train = self._dataset(split), split == "train"
        lengths = [pair_length(p, self.modality) for p in dataset.items] if train and self.bucket_by_length else None
        return epoch_loader(dataset, batch_size=batch_size, shuffle=shuffle,
                            seed=self.seed, trainer=self.trainer, collate_fn=self.collator(train), lengths=lengths,
                            bucket_factor=self.bucket_factor, num_workers=self.num_workers,
                            pin_memory=self.pin_memory, persistent_workers=self.persistent_workers)
