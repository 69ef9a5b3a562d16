"""Prefix-LM attention for an InternVL whose language model was pretrained as a bidirectional encoder.

``model=internvl_minilm`` runs the pretrained MiniLM BERT as the InternVL decoder. MiniLM was
trained with bidirectional attention; under a plain causal mask the tokens of step A can never see
step B, and in the measured runs (README, TEO results) the adapter learnt *whether* two steps depend
on each other but not *which comes first*. UniLM (Dong et al., 2019), the family MiniLM distils,
uses a BERT as a generator with a prefix-LM mask: bidirectional attention inside the prompt, causal
attention over the generated text. :class:`PrefixLMInternVLModel` gives the InternVL layout that
mask:

* the *prefix* of a row is everything up to and including the header of the last chat turn
  (``<|im_start|>assistant``): its tokens attend to every non-padding token of the prefix;
* the answer tokens after it attend causally (the prefix and the earlier answer tokens);
* generation is unchanged: the prefill forward is the whole prompt, i.e. one bidirectional
  block, and each decoding step is a single query over the cache, which a causal mask already
  lets see everything.

The prefix is found in ``input_ids`` (``config.prefix_lm_token_id`` = ``<|im_start|>``, followed by
``config.prefix_lm_header_length - 1`` role tokens), so training through ``model(**inputs,
labels=...)``, :func:`seqaware.teo.vlm.answer_loss` and ``generate`` all see the same attention,
and nothing in the data pipeline changes. A config without ``prefix_lm_token_id`` is causal as
usual. The 8B recipe (a Qwen3 decoder) never uses this class.
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import InternVLModel
from transformers.masking_utils import create_causal_mask


def prefix_lengths(input_ids: torch.Tensor, marker_id: int, header_length: int) -> torch.Tensor:
    """``(B,)`` number of leading tokens of each row that form its prompt prefix.

    The prefix ends ``header_length`` tokens after the *last* ``marker_id`` of the row (the last
    chat turn's ``<|im_start|>`` + role); a row without the marker has no prefix (0: fully causal).
    """
    T = input_ids.shape[1]
    positions = torch.arange(T, device=input_ids.device).expand_as(input_ids)
    last = torch.where(input_ids == marker_id, positions, torch.full_like(positions, -1)).amax(dim=1)
    return torch.where(last >= 0, (last + header_length).clamp(max=T), torch.zeros_like(last))


def prefix_block_ids(input_ids: torch.Tensor, marker_id: int, header_length: int) -> torch.Tensor:
    """``(B, T)`` block ids for :func:`transformers.masking_utils.create_causal_mask`: 0 inside the
    prefix (one bidirectional block), -1 after it (causal)."""
    ends = prefix_lengths(input_ids, marker_id, header_length)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    inside = positions[None, :] < ends[:, None]
    return torch.where(inside, torch.zeros_like(input_ids), torch.full_like(input_ids, -1))


def prefix_lm_mask(config: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, marker_id: int,
                   header_length: int, dtype: torch.dtype) -> Any:
    """The prefix-LM attention mask of ``input_ids`` (2-D padding mask -> the language model's 4-D
    mask in the format of its attention implementation)."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    shape_only = torch.empty(*input_ids.shape, 1, dtype=dtype, device=input_ids.device)
    return create_causal_mask(config=config, inputs_embeds=shape_only, attention_mask=attention_mask,
                              past_key_values=None,
                              block_sequence_ids=prefix_block_ids(input_ids, marker_id, header_length),
                              allow_is_causal_skip=False)


class PrefixLMInternVLModel(InternVLModel):
    """:class:`~transformers.InternVLModel` whose language model attends bidirectionally inside the
    prompt (see the module docstring). Active when ``config.prefix_lm_token_id`` is set."""

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                past_key_values: Any = None, **kwargs: Any) -> Any:
        marker = getattr(self.config, "prefix_lm_token_id", None)
        cached = past_key_values is not None and past_key_values.get_seq_length() > 0
        if marker is not None and input_ids is not None and not cached and (attention_mask is None or attention_mask.dim() == 2):
            attention_mask = prefix_lm_mask(self.language_model.config, input_ids, attention_mask, int(marker),
                                            int(getattr(self.config, "prefix_lm_header_length", 1)), self.dtype)
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, past_key_values=past_key_values,
                               **kwargs)
