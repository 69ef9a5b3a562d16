"""Single-stream multimodal encoder: one transformer over the text and the images of all steps.

Input sequence (Wu et al. 2022, sec. 4; VisualBERT / CLIP-ViL style)::

    [CLS] s_0 tokens [SEP] s_1 tokens [SEP] ... | image_0 tokens | image_1 tokens | ...

* The transformer, word / position / token-type embeddings and embedding LayerNorm are those of a
  Hugging Face text model (MiniLM offline, RoBERTa-large for the paper preset), fed through
  ``inputs_embeds`` so text and visual tokens share one embedding pipeline.
* Visual tokens: ``LayerNorm(Linear(feature))`` of the backbone's patch / grid / region features
  (region encoders add ``Linear(box geometry)`` inside the LayerNorm): ``projected_visual``.
  The LayerNorm's gain starts at the scale of the text model's word embeddings (``visual_scale:
  text``): a plain LayerNorm outputs vectors of norm sqrt(H) (~20 for H = 384), about 20x a
  MiniLM word embedding and 40x a position / token-type / step embedding, so the image tokens
  would carry almost no trace of which step (or which patch) they are -- ISP's swapped images
  and SMRM's masked patches are then nearly undetectable for hundreds of steps.
* Token types: text 0, image 1.  Models with a single token type (RoBERTa) get a 2-row type
  embedding, both rows initialised from the pretrained one; models with none (MPNet) get the
  encoder's own 2-row table added to the input embeddings, text row zero.
* Positions: text tokens 0..T-1 (RoBERTa: offset by its padding index as usual); the tokens of each
  image restart at 0 (patch / region index), so 5 steps x (60 text + 50 patch) tokens fit in a
  512-position model.
* Optional step embedding (``step_embedding``): a learned vector per step index added to every
  text token of step k and every visual token of image k (the step-less CLS / SEP tokens get none).
  Its initial spread is ``step_init_std`` (default: the text model's initializer range, 0.02).
  The step vector is the only thing that tells the images' steps apart (their position ids restart
  at 0): at 0.02 next to pretrained word / position embeddings the transformer is slow to use it and
  ISP stays at chance for hundreds of steps; 0.1 moves ISP off chance sooner on frozen features but
  also perturbs the text tokens it is added to (MLM starts slower), and 0.3 drowns them.
* Image-only variant (``modality: image``): no text; a learned CLS vector (initialised from the text
  model's CLS embedding) starts the sequence.

Visual features reach the encoder in the fusion input (``visual_feats (B, S, P, D)``, see
:mod:`seqaware.objectives.base`), computed by :meth:`SingleStreamEncoder.visual_features` from
pixels (once per image) or precomputed (``visual: null`` + ``visual_feature_dim``, e.g. cached
detector regions).  With ``geometry`` the last 7 feature dims are the box geometry
(:func:`seqaware.encoders.regions.box_geometry`), so swaps / masking of whole tokens by the
objectives keep features and boxes together.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
from torch import nn

from seqaware.encoders.base import plain_config, SequenceEncoder
from seqaware.encoders.regions import GEOMETRY_DIM, BoxRegionFeatures
from seqaware.encoders.text import TextEncoder
from seqaware.encoders.visual import FrozenFeatureCache, VisualBackbone, create_visual_backbone
from seqaware.encoders.contract import EncoderOutput
from seqaware.encoders.packing import run_transformer

MODALITIES = ("multimodal", "image", "text")


_plain = plain_config


class SingleStreamEncoder(SequenceEncoder):
    """One HF transformer over text tokens then visual tokens (see the module docstring).

    Args:
        name_or_path: HF text model (hub id, ``save_pretrained`` folder or ``offline:minilm``) whose
            transformer and embeddings the encoder uses; ignored when ``config`` is given.
        config: ``AutoConfig`` fields (with ``model_type``) of a randomly initialised text model.
        tokenizer: tokenizer whose special ids the encoder records (default: ``name_or_path``).
        visual: visual backbone config (``name`` + :mod:`seqaware.encoders.visual` arguments) or
            None for precomputed features of ``visual_feature_dim`` dims.
        modality: ``multimodal`` (text + images), ``image`` (images only) or ``text`` (no visual part:
            the text-only ablation of the same encoder, step embedding included).
        regions: :class:`BoxRegionFeatures` arguments: pool the CNN grid in the batch's object boxes
            (VisualBERT on the synthetic data); None uses the backbone's token grid (CLIP-ViL).
        geometry: the visual features carry 7 box-geometry dims (default: True with ``regions``).
        visual_feature_dim: D of precomputed features (excluding geometry) when ``visual`` is None.
        step_embedding: add a learned step-index embedding (off in the wu2022 preset).
        step_init_std: standard deviation of the step embedding's random initialisation (default:
            the text model's ``initializer_range``, 0.02 for BERT / RoBERTa); see the module docstring.
        visual_positions: position ids of the visual tokens: ``image`` (0..P-1 in every image; the
            step embedding tells the images apart) or ``sequence`` (0..S*P-1 over the images in
            order, as the text tokens run over the steps: what orders the images when the step
            embedding is off, as in the wu2022 preset).
        max_steps: size of the step embedding table.
        attn_implementation: ``sdpa`` (default) or ``eager``.
        gradient_checkpointing: recompute transformer activations in backward.
        visual_scale: initial gain of the visual tokens' LayerNorm: ``text`` (default) matches the
            mean norm of the text model's word embeddings, so the position, token-type and step
            embeddings added to the visual tokens are not drowned (see the module docstring); a
            number sets the gain directly (1.0: the plain LayerNorm initialisation).
        feature_cache_mb: with a frozen visual backbone (``trainable: false``), keep each image's
            backbone output in memory, up to this many megabytes, instead of recomputing it at every
            step (:class:`~seqaware.encoders.visual.FrozenFeatureCache`); 0 turns it off.  A trainable
            backbone is never cached.
    """

    def __init__(self, name_or_path: str = "offline:minilm", config: Optional[Mapping] = None,
                 tokenizer: Optional[str] = None, visual: Optional[Mapping] = None, modality: str = "multimodal",
                 regions: Optional[Mapping] = None, geometry: Optional[bool] = None,
                 visual_feature_dim: Optional[int] = None, step_embedding: bool = True, max_steps: int = 16,
                 visual_positions: str = "image", attn_implementation: str = "sdpa", gradient_checkpointing: bool = False,
                 visual_scale: str | float = "text",
                 step_init_std: Optional[float] = None, feature_cache_mb: float = 2048):
        super().__init__()
        if modality not in MODALITIES:
            raise ValueError(f"SingleStreamEncoder modality must be one of {MODALITIES}, got {modality!r}")
        self.modality = modality
        text_enc = TextEncoder(name_or_path=name_or_path, config=_plain(config) or None, tokenizer=tokenizer,
                               attn_implementation=attn_implementation,
                               gradient_checkpointing=gradient_checkpointing)
        self.backbone = text_enc.backbone
        for attr in ("cls_token_id", "pad_token_id", "mask_token_id", "special_token_ids", "pair_sep_id", "vocab_size",
                     "hidden_size"):
            setattr(self, attr, getattr(text_enc, attr))
        hf_cfg = self.backbone.config
        H = self.hidden_size
        emb = self.backbone.embeddings
        init_std = float(getattr(hf_cfg, "initializer_range", 0.02))
        # models without token types (MPNet): the encoder's own type table, added to the input embeddings
        # before the model's embedding LayerNorm as BERT adds its own; the text row is zero, so text
        # tokens enter exactly as the pretrained model embeds them
        self.type_embedding: Optional[nn.Embedding] = None
        if getattr(emb, "token_type_embeddings", None) is None:
            self.type_embedding = nn.Embedding(2, H)
            with torch.no_grad():
                self.type_embedding.weight[0].zero_()
                self.type_embedding.weight[1].normal_(std=init_std)
        elif emb.token_type_embeddings.num_embeddings < 2:
            old = emb.token_type_embeddings
            new = nn.Embedding(2, H).to(old.weight.device, old.weight.dtype)
            with torch.no_grad():
                new.weight.copy_(old.weight[0].expand(2, H))
            emb.token_type_embeddings = new
            hf_cfg.type_vocab_size = 2
        # RoBERTa-style position ids start after the padding index
        self.position_offset = int(emb.padding_idx) + 1 if hasattr(emb, "padding_idx") else 0
        self.max_positions = int(hf_cfg.max_position_embeddings)
        eps = float(getattr(hf_cfg, "layer_norm_eps", 1e-12))

        self.visual: Optional[VisualBackbone] = None
        self.feature_cache: Optional[FrozenFeatureCache] = None
        self.regions = None
        self.geometry = False
        self.visual_proj = self.geometry_proj = self.visual_norm = None
        self.visual_feature_dim = 0
        if self.uses_images:  # modality text: the same encoder without any visual part (text-only ablations)
            vis_cfg = _plain(visual)
            self.visual = create_visual_backbone(**vis_cfg) if vis_cfg else None
            if self.visual is not None and float(feature_cache_mb) > 0:
                self.feature_cache = FrozenFeatureCache(feature_cache_mb)
                # new weights, new features: empty the cache whenever the tower's weights are loaded
                self.visual.register_load_state_dict_post_hook(self._clear_feature_cache)
            self.regions = BoxRegionFeatures(**_plain(regions)) if regions is not None else None
            if self.regions is not None and (self.visual is None or not self.visual.is_grid):
                raise ValueError("regions need a CNN grid backbone (backbones.visual.name: efficientnet_lite0 or resnet50)")
            self.geometry = bool(self.regions is not None if geometry is None else geometry)
            if self.visual is not None:
                feat_dim = self.visual.out_dim
            elif visual_feature_dim:
                feat_dim = int(visual_feature_dim)
            else:
                raise ValueError("SingleStreamEncoder needs a visual backbone (visual.name) or visual_feature_dim")
            self.visual_feature_dim = feat_dim
            self.visual_proj = nn.Linear(feat_dim, H)
            self.geometry_proj = nn.Linear(GEOMETRY_DIM, H) if self.geometry else None
            self.visual_norm = nn.LayerNorm(H, eps=eps)
            with torch.no_grad():
                self.visual_norm.weight.fill_(self._visual_gain(visual_scale))
        self.max_steps = int(max_steps)
        if visual_positions not in ("image", "sequence"):
            raise ValueError(f"model.encoder.visual_positions must be 'image' or 'sequence', got {visual_positions!r}")
        self.visual_positions = visual_positions
        self.step_embedding = nn.Embedding(self.max_steps, H) if step_embedding else None
        if self.step_embedding is not None:
            std = init_std if step_init_std is None else float(step_init_std)
            if not std > 0:
                raise ValueError(f"model.encoder.step_init_std must be a positive number, got {step_init_std!r}")
            nn.init.normal_(self.step_embedding.weight, std=std)
        if modality == "image":
            self.cls_embedding = nn.Parameter(self.word_embeddings.weight[self.cls_token_id].detach().clone())
            # no text input: the word embeddings are never used (frozen, so DDP sees no unused parameters)
            self.word_embeddings.weight.requires_grad_(False)

    def _visual_gain(self, visual_scale: str | float) -> float:
        """Initial LayerNorm gain of the visual tokens for ``visual_scale`` (see the class docstring)."""
        if isinstance(visual_scale, str):
            if visual_scale != "text":
                raise ValueError(f"model.encoder.visual_scale must be 'text' or a positive number, got {visual_scale!r}")
            words = self.word_embeddings.weight.detach().float()
            return float(words.norm(dim=1).mean()) / self.hidden_size ** 0.5
        if not float(visual_scale) > 0:
            raise ValueError(f"model.encoder.visual_scale must be 'text' or a positive number, got {visual_scale!r}")
        return float(visual_scale)

    def new_parameters(self) -> list[nn.Parameter]:
        """Visual projection, box-geometry projection, visual LayerNorm, step embedding, the token-type
        table of a model without one (MPNet) and the image-only CLS vector: the layers this class adds
        to the pretrained text model."""
        modules = [self.visual_proj, self.geometry_proj, self.visual_norm, self.step_embedding, self.type_embedding]
        params = [p for m in modules if m is not None for p in m.parameters()]
        if self.modality == "image":
            params.append(self.cls_embedding)
        return params

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The text model's input embedding matrix (tie an MLM head's decoder to it)."""
        return self.backbone.get_input_embeddings()

    @property
    def image_mean(self) -> tuple[float, ...]:
        return self.visual.mean if self.visual is not None else ()

    @property
    def image_std(self) -> tuple[float, ...]:
        return self.visual.std if self.visual is not None else ()

    def visual_features(self, pixel_values: torch.Tensor, boxes: Optional[torch.Tensor] = None,
                        box_mask: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``pixels (N, 3, H, W)`` -> ``(feats (N, P, D[+7]), patch_mask (N, P) | None)``."""
        if self.visual is None:
            raise ValueError("this encoder reads precomputed visual features (visual: null): attach cached region "
                             "features with data.collator.region_features=DIR (scripts/tools/extract_features.py --out DIR) "
                             "or put them in the fusion input's 'visual_feats'")
        if self.regions is None:
            return self._backbone(self.visual, pixel_values, "tokens"), None
        if boxes is None or box_mask is None:
            raise ValueError("the region encoder needs object boxes: set data.collator.max_boxes > 0 "
                             "(the synthetic data records them)")
        feats, geometry, mask = self.regions(self._backbone(self.visual.grid, pixel_values, "grid"), boxes, box_mask)
        return torch.cat([feats, geometry.to(feats.dtype)], dim=-1), mask

    def _clear_feature_cache(self, module: nn.Module, incompatible_keys: Any) -> None:
        if self.feature_cache is not None:
            self.feature_cache.clear()

    def _backbone(self, fn, pixels: torch.Tensor, tag: str) -> torch.Tensor:
        """``fn(pixels)`` through the frozen-feature cache when the backbone is frozen."""
        frozen = not self.visual.trainable and not any(p.requires_grad for p in self.visual.parameters())
        if self.feature_cache is None or not frozen:
            return fn(pixels)
        return self.feature_cache(fn, pixels, tag)

    def project_visual(self, feats: torch.Tensor) -> torch.Tensor:
        """``(..., D[+7])`` visual features -> ``(..., H)`` input tokens (Linear [+ geometry] + LayerNorm)."""
        feats = feats.to(self.visual_proj.weight.dtype)
        if self.geometry_proj is not None:
            x = self.visual_proj(feats[..., :-GEOMETRY_DIM]) + self.geometry_proj(feats[..., -GEOMETRY_DIM:])
        else:
            x = self.visual_proj(feats)
        return self.visual_norm(x)

    def _step_vectors(self, step: torch.Tensor) -> torch.Tensor:
        """Step embeddings of ``step`` ids (-1 -> zeros)."""
        assert self.step_embedding is not None
        if step.numel() and int(step.max()) >= self.max_steps:
            raise ValueError(f"step index {int(step.max())} >= max_steps={self.max_steps} (model.encoder.max_steps)")
        vec = self.step_embedding(step.clamp(min=0))
        return vec * (step >= 0)[..., None].to(vec.dtype)

    def forward(self, fusion_input: dict) -> EncoderOutput:
        embeds, masks, types, positions = [], [], [], []
        H = self.hidden_size
        if self.uses_text:
            ids = fusion_input["input_ids"]
            B, T = ids.shape
            device = ids.device
            text = self.word_embeddings(ids)
            step = fusion_input.get("text_step")
            if self.step_embedding is not None and step is not None:
                text = text + self._step_vectors(step)
            embeds.append(text)
            masks.append(fusion_input["attention_mask"].bool())
            positions.append(torch.arange(T, device=device).expand(B, T))
        else:
            feats = fusion_input["visual_feats"]
            B, T, device = feats.shape[0], 1, feats.device
            embeds.append(self.cls_embedding.expand(B, 1, H))
            masks.append(torch.ones(B, 1, dtype=torch.bool, device=device))
            positions.append(torch.zeros(B, 1, dtype=torch.long, device=device))
        types.append(torch.zeros(B, T, dtype=torch.long, device=device))
        if T - 1 + self.position_offset >= self.max_positions:
            raise ValueError(f"{T} text tokens exceed the text model's {self.max_positions} positions; "
                             "lower data.collator.max_tokens or data.view.max_steps")

        projected = None
        S = P = 0
        if self.uses_images:
            feats = fusion_input["visual_feats"]
            S, P = feats.shape[1], feats.shape[2]
            expected = self.visual_feature_dim + (GEOMETRY_DIM if self.geometry else 0)
            if feats.shape[-1] != expected:
                raise ValueError(
                    f"visual features have {feats.shape[-1]} dims, the encoder expects {expected} "
                    f"(visual_feature_dim {self.visual_feature_dim}" + (f" + {GEOMETRY_DIM} box geometry" if self.geometry
                                                                      else "") + "); cached region features need "
                    "model.encoder.visual_feature_dim = the extractor's D (1024 for extract_features.py)")
            projected = self.project_visual(feats)  # (B, S, P, H)
            vis = projected
            if self.step_embedding is not None:
                vis = vis + self._step_vectors(torch.arange(S, device=device))[None, :, None, :]
            vmask = fusion_input["visual_mask"].bool()[:, :, None].expand(B, S, P)
            patch_mask = fusion_input.get("patch_mask")
            if patch_mask is not None:
                vmask = vmask & patch_mask.bool()
            embeds.append(vis.reshape(B, S * P, H))
            masks.append(vmask.reshape(B, S * P))
            types.append(torch.ones(B, S * P, dtype=torch.long, device=device))
            if self.visual_positions == "sequence":
                if S * P - 1 + self.position_offset >= self.max_positions:
                    raise ValueError(f"{S} images x {P} visual tokens exceed the text model's {self.max_positions} "
                                     "positions with model.encoder.visual_positions=sequence; use 'image' (with the "
                                     "step embedding) or fewer steps / visual tokens")
                positions.append(torch.arange(S * P, device=device).expand(B, S * P))
            else:
                positions.append(torch.arange(P, device=device).repeat(S).expand(B, S * P))

        inputs = torch.cat(embeds, dim=1).to(self.word_embeddings.weight.dtype)
        type_ids = torch.cat(types, dim=1)
        extra = {}
        if self.type_embedding is None:
            extra["token_type_ids"] = type_ids
        else:
            inputs = inputs + self.type_embedding(type_ids).to(inputs.dtype)
        states = run_transformer(self, torch.cat(masks, dim=1), inputs_embeds=inputs,
                                 position_ids=torch.cat(positions, dim=1) + self.position_offset, **extra)
        return EncoderOutput(
            cls=states[:, 0],
            text_states=states[:, :T] if self.uses_text else None,
            patch_states=states[:, T:].reshape(B, S, P, H) if self.uses_images else None,
            projected_visual=projected,
        )
