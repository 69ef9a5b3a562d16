"""Text-only sequence encoder: any Hugging Face encoder (BERT, RoBERTa, MiniLM) through ``AutoModel``.

The packed multi-step text (``[CLS] s_0 [SEP] s_1 [SEP] ...``, see :func:`seqaware.encoders.base.pack_steps`)
runs through the transformer once; the [CLS] state, all token states and each token's step index
are what objectives and decoders use.

Weights: ``name_or_path`` is a hub id, a local ``save_pretrained`` folder or an offline alias
(``offline:minilm``), loaded with :func:`seqaware.pretrained.from_pretrained` (fails fast without the
hub).  ``config`` (a dict of ``AutoConfig`` fields with ``model_type``) builds a randomly initialised
model instead -- tests and from-scratch runs; the tokenizer is still ``tokenizer`` (default: the
same ``name_or_path``), whose special-token ids the encoder records.
"""
from __future__ import annotations

from typing import Optional

import torch
from transformers import AutoConfig, AutoModel

from seqaware.encoders.base import SequenceEncoder, plain_config
from seqaware.encoders.contract import EncoderOutput
from seqaware.pretrained import from_pretrained, load_tokenizer


def special_token_ids(tokenizer) -> dict[str, int | list[int]]:
    """The ids an encoder needs from its tokenizer (CLS/BOS, PAD, MASK, all special ids)."""
    cls_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    if cls_id is None or tokenizer.pad_token_id is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} needs a CLS (or BOS) and a PAD token")
    return {"cls_token_id": int(cls_id), "pad_token_id": int(tokenizer.pad_token_id),
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
        attn_implementation: ``sdpa`` (default) or ``eager``.
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
            hf_config._attn_implementation = attn_implementation
            self.backbone = AutoModel.from_config(hf_config, add_pooling_layer=False)
        else:
            self.backbone = from_pretrained(AutoModel.from_pretrained, name_or_path, what="text encoder",
                                            config_key="backbones.text",
                                            attn_implementation=attn_implementation, add_pooling_layer=False)
        tok = load_tokenizer(tokenizer or name_or_path)
        ids = special_token_ids(tok)
        self.cls_token_id = ids["cls_token_id"]
        self.pad_token_id = ids["pad_token_id"]
        self.mask_token_id = ids["mask_token_id"]
        self.special_token_ids = ids["special_token_ids"]
        self.vocab_size = int(self.backbone.config.vocab_size)
        if len(tok) > self.vocab_size:
            raise ValueError(f"the tokenizer {tokenizer or name_or_path!r} has {len(tok)} tokens but the "
                             f"text model's vocabulary has {self.vocab_size}")
        self.hidden_size = int(self.backbone.config.hidden_size)
        self.type_vocab_size = int(getattr(self.backbone.config, "type_vocab_size", 1) or 1)
        if gradient_checkpointing:
            self.backbone.gradient_checkpointing_enable()

    @property
    def word_embeddings(self) -> torch.nn.Embedding:
        return self.backbone.get_input_embeddings()

    def forward(self, fusion_input: dict) -> EncoderOutput:
        ids = fusion_input["input_ids"]
        types = fusion_input.get("token_type_ids")
        if types is None or self.type_vocab_size < 2:
            types = torch.zeros_like(ids)  # RoBERTa has a single token type
        out = self.backbone(input_ids=ids, attention_mask=fusion_input["attention_mask"], token_type_ids=types)
        states = out.last_hidden_state
        return EncoderOutput(cls=states[:, 0], text_states=states)
