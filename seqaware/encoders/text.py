"""Text-only sequence encoder: any Hugging Face encoder (BERT, RoBERTa, MiniLM) through ``AutoModel``.

The packed multi-step text (``[CLS] s_0 [SEP] s_1 [SEP] ...``, see :func:`seqaware.encoders.base.pack_steps`)
runs through the transformer once; the [CLS] state, all token states and each token's step index
are what objectives and decoders use.

Weights: ``name_or_path`` is a hub id, a local ``save_pretrained`` folder or an offline alias
(``offline:minilm``, ``offline:mpnet``), loaded with :func:`seqaware.pretrained.from_pretrained` (fails fast without the
hub).  ``config`` (a dict of ``AutoConfig`` fields with ``model_type``) builds a randomly initialised
model instead -- tests and from-scratch runs; the tokenizer is still ``tokenizer`` (default: the
same ``name_or_path``), whose special-token ids the encoder records.

Model families differ in two ways the encoders absorb here:

* **Token types.**  BERT / MiniLM have two, RoBERTa one, MPNet none (no ``token_type_ids`` input at
  all).  :attr:`TextEncoder.type_vocab_size` is 2, 1 or 0 accordingly; the ids are passed to the model
  only when it has token-type embeddings, and options that need two types (BERT4SO segments) are
  refused when a module is built.
* **Packing.**  With :attr:`packed` (``model.packed``) the transformer runs on the real tokens only
  (:mod:`seqaware.encoders.packing`: BERT / MiniLM, RoBERTa, MPNet); the states come back in the padded layout.
* **Attention kernels.**  ``attn_implementation: sdpa`` (the default) falls back to ``eager`` for a model
  class transformers has no SDPA kernel for (MPNet in transformers 5.23), with an info log line.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import torch
from transformers import AutoConfig, AutoModel

from seqaware.encoders.base import SequenceEncoder, plain_config
from seqaware.encoders.contract import EncoderOutput
from seqaware.encoders.packing import run_transformer
from seqaware.pretrained import from_pretrained, load_tokenizer

log = logging.getLogger(__name__)


def with_attention_fallback(build: Callable[[str], Any], attn_implementation: str, what: str) -> Any:
    """``build(attn_implementation)``; when SDPA was asked for and the model class has no SDPA kernel
    (transformers raises a ValueError naming it), ``build("eager")`` instead."""
    try:
        return build(attn_implementation)
    except ValueError as err:
        if attn_implementation != "sdpa" or not any(k in str(err) for k in ("sdpa", "scaled_dot_product_attention")):
            raise
        log.info("%s has no SDPA attention in this transformers version: using eager attention", what)
        return build("eager")


def token_type_count(model: torch.nn.Module) -> int:
    """How many token types the model embeds: 0 when it takes no ``token_type_ids`` (MPNet)."""
    table = getattr(getattr(model, "embeddings", None), "token_type_embeddings", None)
    return int(table.num_embeddings) if isinstance(table, torch.nn.Embedding) else 0


def special_token_ids(tokenizer) -> dict[str, int | list[int]]:
    """The ids an encoder needs from its tokenizer (CLS/BOS, PAD, MASK, all special ids)."""
    cls_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    if cls_id is None or tokenizer.pad_token_id is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} needs a CLS (or BOS) and a PAD token")
    # how the tokenizer packs a pair: [CLS] a [SEP] b [SEP] (BERT) or <s> a </s></s> b </s> (RoBERTa, MPNet)
    single = list(tokenizer("a")["input_ids"])                      # [CLS] a [SEP]
    pair = list(tokenizer("a", "b")["input_ids"])
    end = len(single) - 1                                           # where a's separator sits in the pair
    pair_sep = int(single[-1]) if pair[end:end + 2] == [single[-1]] * 2 else None
    return {"cls_token_id": int(cls_id), "pad_token_id": int(tokenizer.pad_token_id), "pair_sep_id": pair_sep,
            "mask_token_id": int(tokenizer.mask_token_id) if tokenizer.mask_token_id is not None else -1,
            "special_token_ids": sorted(int(i) for i in tokenizer.all_special_ids)}


class TextEncoder(SequenceEncoder):
    """A Hugging Face text encoder over the packed steps of an instance.

    Args:
        name_or_path: pretrained weights (hub id, folder, or ``offline:minilm``); ignored when
            ``config`` is given.
        config: ``AutoConfig.for_model`` fields (must include ``model_type``) for a randomly
            initialised transformer.
        tokenizer: the tokenizer whose ids the data uses (default: ``name_or_path``).
        attn_implementation: ``sdpa`` (default; ``eager`` for models without an SDPA kernel) or ``eager``.
        gradient_checkpointing: recompute activations in backward (saves memory on long pair batches).
    """

    modality = "text"

    def __init__(self, name_or_path: str = "offline:minilm", config: Optional[dict] = None,
                 tokenizer: Optional[str] = None, attn_implementation: str = "sdpa",
                 gradient_checkpointing: bool = False):
        super().__init__()
        if config is not None:
            cfg = plain_config(config)
            model_type = cfg.pop("model_type", None)
            if model_type is None:
                raise ValueError("model.encoder.config needs a 'model_type' (e.g. bert, roberta)")
            hf_config = AutoConfig.for_model(model_type, **cfg)

            def build(attn: str) -> torch.nn.Module:
                hf_config._attn_implementation = attn
                return AutoModel.from_config(hf_config, add_pooling_layer=False)

            what = f"model_type {model_type!r}"
        else:
            def build(attn: str) -> torch.nn.Module:
                return from_pretrained(AutoModel.from_pretrained, name_or_path, what="text encoder",
                                       config_key="backbones.text", attn_implementation=attn, add_pooling_layer=False)

            what = repr(name_or_path)
        self.backbone = with_attention_fallback(build, attn_implementation, what)
        tok = load_tokenizer(tokenizer or name_or_path)
        ids = special_token_ids(tok)
        self.cls_token_id = ids["cls_token_id"]
        self.pad_token_id = ids["pad_token_id"]
        self.mask_token_id = ids["mask_token_id"]
        self.special_token_ids = ids["special_token_ids"]
        self.pair_sep_id = ids["pair_sep_id"]   # None: BERT's pair format; else a second separator opens step b
        self.vocab_size = int(self.backbone.config.vocab_size)
        if len(tok) > self.vocab_size:
            raise ValueError(f"the tokenizer {tokenizer or name_or_path!r} has {len(tok)} tokens but the "
                             f"text model's vocabulary has {self.vocab_size}")
        self.hidden_size = int(self.backbone.config.hidden_size)
        self.type_vocab_size = token_type_count(self.backbone)   # 2 BERT, 1 RoBERTa, 0 MPNet
        if gradient_checkpointing:
            self.backbone.gradient_checkpointing_enable()

    @property
    def word_embeddings(self) -> torch.nn.Embedding:
        return self.backbone.get_input_embeddings()

    def forward(self, fusion_input: dict) -> EncoderOutput:
        ids = fusion_input["input_ids"]
        extra = {}
        if self.type_vocab_size:  # MPNet takes no token types
            types = fusion_input.get("token_type_ids")
            if types is None or self.type_vocab_size < 2:
                types = torch.zeros_like(ids)  # RoBERTa has a single token type
            extra["token_type_ids"] = types
        states = run_transformer(self, fusion_input["attention_mask"], input_ids=ids, **extra)
        return EncoderOutput(cls=states[:, 0], text_states=states)
