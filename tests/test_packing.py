"""Packed (unpadded) encoder passes (``model.packed``, seqaware/encoders/packing.py) and the work a step counts
(seqaware/profiling.py): the same logits and gradients as the padded pass, padding kept out of every linear
layer, positions and MPNet's relative buckets per sequence, FLOPs from the real tokens."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch
from torch.overrides import TorchFunctionMode

from seqaware.encoders import create_encoder
from seqaware.encoders.packing import Layout, check_packable, packed_forward, packing_family
from seqaware.modules.berson import BersonModule
from seqaware.profiling import (StepWork, WorkMeter, counted_flops, gpu_peak_flops, machine, transformer_flops,
                                transformer_shape)
from test_berson import _batch
from test_encoders import TINY_VIT

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
CONFIGS = {"bert": {"model_type": "bert", "vocab_size": 30522, "max_position_embeddings": 128, **TINY},
           "mpnet": {"model_type": "mpnet", "vocab_size": 30527, "max_position_embeddings": 514, **TINY},
           "roberta": {"model_type": "roberta", "vocab_size": 30527, "max_position_embeddings": 130, "type_vocab_size": 1,
                       "pad_token_id": 1, **TINY},
           "xlm-roberta": {"model_type": "xlm-roberta", "vocab_size": 30527, "max_position_embeddings": 130,
                           "type_vocab_size": 1, "pad_token_id": 1, **TINY}}
# BERSON equivalence: MiniLM (all-MiniLM-L6-v2's real weights, offline) and a tiny random MPNet (eager attention)
MODELS = {"minilm": {"name_or_path": "offline:minilm"}, "mpnet": {"config": CONFIGS["mpnet"]}}


def _encoder(kind: str, name: str = "text", **kwargs):
    torch.manual_seed(0)
    return create_encoder(name, config=CONFIGS[kind], tokenizer="offline:minilm", **kwargs).eval()


def _ragged(B: int = 4, T: int = 13, seed: int = 0, pad_id: int = 0) -> dict:
    """Right-padded ids (B, T) of lengths T, T-3, ..., each opening with [CLS]."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 5000, (B, T), generator=g)
    lengths = torch.tensor([T - 3 * b for b in range(B)])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    ids[:, 0] = 101
    ids[mask == 0] = pad_id
    return {"input_ids": ids, "attention_mask": mask}


# ------------------------------------------------------------------ the encoder pass
@pytest.mark.parametrize("kind", ["bert", "mpnet", "roberta", "xlm-roberta"])
def test_each_packed_sequence_is_encoded_as_if_alone(kind):
    """Positions restart per sequence and MPNet's buckets are the sequence's own: the packed state of every real
    token equals the model run on that sequence alone, without padding; padding states are 0."""
    enc = _encoder(kind)
    fusion = _ragged(pad_id=enc.pad_token_id)
    enc.packed = True
    with torch.no_grad():
        packed = enc(fusion).text_states
        for b, n in enumerate(fusion["attention_mask"].sum(1).tolist()):
            enc.packed = False
            alone = enc({k: v[b:b + 1, :n] for k, v in fusion.items()}).text_states[0]
            torch.testing.assert_close(packed[b, :n], alone, rtol=1e-5, atol=1e-5)
            assert not packed[b, n:].any()


class _Linears(TorchFunctionMode):
    """Records the rows (tokens) of every ``F.linear`` call."""

    def __init__(self):
        super().__init__()
        self.rows: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.linear:
            self.rows.append(args[0].shape[:-1].numel())
        return func(*args, **(kwargs or {}))


def _linear_rows(forward, fusion: dict) -> list[int]:
    with torch.no_grad(), _Linears() as mode:
        forward(fusion)
    return mode.rows


@pytest.mark.parametrize("kind", ["bert", "mpnet"])
def test_padding_never_reaches_a_linear_layer(kind):
    """Packed, every linear layer of the transformer (query / key / value as one matmul, output, feed-forward) takes
    exactly the real tokens: sum(attention_mask) rows for each encoder call of BERSON's joint windows and pair chunks,
    and the single-stream encoder's text + real image tokens; padded, it takes B x T."""
    batch = _batch("text", (5, 3, 4), ragged=True)
    for pair_encoding in ("joint", "pairwise"):
        module = _berson("mpnet" if kind == "mpnet" else "tiny_bert", pair_encoding, packed=True)
        calls, forward = [], module.encoder.forward

        def recording(fusion):
            calls.append((fusion, _linear_rows(forward, fusion)))
            return forward(fusion)
        module.encoder.forward = recording
        with torch.no_grad():
            module.encode(batch)
        assert calls
        for fusion, rows in calls:
            mask = fusion["attention_mask"]
            assert rows == [int(mask.sum())] * 4 * 2 and int(mask.sum()) < mask.numel()   # 4 matmuls x 2 layers
        module.encoder.packed = False
        assert set(_linear_rows(forward, calls[0][0])) == {calls[0][0]["attention_mask"].numel()}
    enc = _encoder(kind, "clipvil", visual=TINY_VIT, max_steps=4)
    enc.packed = True
    fusion = {**_ragged(B=2, T=9, pad_id=enc.pad_token_id), "visual_feats": torch.randn(2, 3, 5, enc.visual.out_dim),
              "visual_mask": torch.tensor([[True, False, True], [True, True, False]])}
    rows = _linear_rows(enc, fusion)
    assert rows[0] == 2 * 3 * 5                                            # the visual projection: every slot
    assert rows[1:] == [int(fusion["attention_mask"].sum()) + 4 * 5] * 8   # text + 4 real images of 5 tokens


def test_the_packed_single_stream_encoder_matches_the_padded_one():
    for kind in ("bert", "mpnet"):
        enc = _encoder(kind, "clipvil", visual=TINY_VIT, max_steps=4)
        fusion = {**_ragged(B=2, T=9, pad_id=enc.pad_token_id), "text_step": torch.zeros(2, 9, dtype=torch.long),
                  "visual_feats": torch.randn(2, 3, 5, enc.visual.out_dim, generator=torch.Generator().manual_seed(1)),
                  "visual_mask": torch.tensor([[True, False, True], [True, True, False]])}
        with torch.no_grad():
            padded = enc(fusion)
            enc.packed = True
            packed = enc(fusion)
        real = fusion["attention_mask"].bool()
        torch.testing.assert_close(packed.text_states[real], padded.text_states[real], rtol=1e-5, atol=1e-5)
        images = fusion["visual_mask"]
        torch.testing.assert_close(packed.patch_states[images], padded.patch_states[images], rtol=1e-5, atol=1e-5)
        assert not packed.patch_states[~images].any()


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_the_packed_pass_recomputes_layers_under_gradient_checkpointing(kind):
    """``gradient_checkpointing: true`` recomputes each packed layer in backward (the same gradients, fewer saved
    activations); dropout draws the same masks again (the 0.1 of the config here).  (MPNet: transformers has no
    activation checkpointing for it, and the encoder refuses the option for it padded or packed.)"""
    fusion = _ragged(B=3, T=10)
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        config = {**CONFIGS[kind], "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
        enc = create_encoder("text", config=config, tokenizer="offline:minilm", gradient_checkpointing=checkpointing)
        enc.packed = True
        enc.train()
        torch.manual_seed(1)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            states = enc(fusion).text_states
        states[fusion["attention_mask"].bool()].pow(2).sum().backward()
        grads.append((torch.cat([p.grad.flatten() for p in enc.parameters() if p.grad is not None]), sum(saved)))
    (plain, plain_saved), (recomputed, recomputed_saved) = grads
    torch.testing.assert_close(recomputed, plain, rtol=1e-5, atol=1e-6)
    assert recomputed_saved < plain_saved / 2


def test_layout_moves_rows_between_the_padded_and_the_packed_layout():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    layout = Layout(mask)
    x = torch.arange(9.0).view(3, 3, 1)
    assert layout.tokens == 6 and layout.index.tolist() == [0, 1, 3, 6, 7, 8]
    assert layout.unpad(x).flatten().tolist() == [0, 1, 3, 6, 7, 8]
    assert layout.pad(layout.unpad(x)).flatten().tolist() == [0, 1, 0, 3, 0, 0, 6, 7, 8]


def test_models_without_a_packed_pass_are_refused_naming_the_switch():
    assert packing_family(_encoder("bert").backbone) == "bert" and packing_family(_encoder("mpnet").backbone) == "mpnet"
    for config in (SimpleNamespace(model_type="electra"), SimpleNamespace(model_type="bert", is_decoder=True),
                   SimpleNamespace(model_type="bert", position_embedding_type="relative_key")):
        encoder = SimpleNamespace(backbone=SimpleNamespace(config=config))
        with pytest.raises(ValueError, match=r"model.packed=true: the packed pass covers .*set model.packed=false"):
            check_packable(encoder)
    with pytest.raises(ValueError, match="no packed pass for model type 'electra'"):
        packed_forward(SimpleNamespace(config=SimpleNamespace(model_type="electra")), torch.ones(1, 2))


# ------------------------------------------------------------------ BERSON: logits and gradients
def _berson(model: str, pair_encoding: str, packed: bool = False) -> BersonModule:
    encoder = {"_target_": "seqaware.encoders.create_encoder", "name": "text", "tokenizer": "offline:minilm",
               **(MODELS[model] if model in MODELS else {"config": CONFIGS["bert"]})}
    torch.manual_seed(0)
    return BersonModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3},
                        decoder={"paragraph_heads": 4, "dropout": 0.0}, pair_encoding=pair_encoding,
                        pair_dropout=0.0, packed=packed).eval()


def _logits_and_grads(module: BersonModule, batch: dict, bf16: bool) -> tuple[torch.Tensor, torch.Tensor]:
    module.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        losses, state = module._losses(batch)
    losses["loss"].backward()
    grads = torch.cat([p.grad.flatten() for p in module.encoder.parameters() if p.grad is not None])
    return state.pair_logits.float().detach(), grads


@pytest.fixture(scope="module")
def berson_pairs():
    """(padded, packed) modules with the same weights per (model, pair encoding), and a ragged batch."""
    pairs = {}
    for model in MODELS:
        for pair_encoding in ("joint", "pairwise"):
            padded, packed = _berson(model, pair_encoding), _berson(model, pair_encoding, packed=True)
            packed.load_state_dict(padded.state_dict())
            pairs[model, pair_encoding] = (padded, packed)
    return pairs, _batch("text", (4, 3, 2), ragged=True)


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("pair_encoding", ["joint", "pairwise"])
def test_packed_berson_has_the_padded_logits_and_gradients(berson_pairs, model, pair_encoding):
    """fp32: equal within 1e-5 (of the largest logit / gradient).  bf16 autocast: the packed pass's logits are within
    2% of the padded pass's largest, its encoder gradient within 15% (norm) of the padded one and pointing the same way
    (cosine > 0.99) -- bf16's own error: the padded bf16 gradients are 2-10% from the fp32 ones here."""
    pairs, batch = berson_pairs
    padded, packed = pairs[model, pair_encoding]
    ref_logits, ref_grads = _logits_and_grads(padded, batch, bf16=False)
    logits, grads = _logits_and_grads(packed, batch, bf16=False)
    assert (logits - ref_logits).abs().max() <= 1e-5 * ref_logits.abs().max()
    assert (grads - ref_grads).abs().max() <= 1e-5 * ref_grads.abs().max()
    assert torch.equal(logits != 0, ref_logits != 0)                       # the same valid pairs
    pad_logits, pad_grads = _logits_and_grads(padded, batch, bf16=True)
    logits, grads = _logits_and_grads(packed, batch, bf16=True)
    assert (logits - pad_logits).abs().max() <= 2e-2 * pad_logits.abs().max()
    assert (grads - pad_grads).norm() <= 0.15 * pad_grads.norm()
    assert torch.nn.functional.cosine_similarity(grads, pad_grads, dim=0) > 0.99


def test_packed_bf16_encoder_states_and_gradients_are_as_accurate_as_padded():
    """At the encoder itself, bf16 autocast: the packed pass is no further from the fp32 states / gradients than the
    padded pass is (within 1.5x; measured 0.99-1.01x), for BERT (SDPA both ways) and MPNet (eager attention padded,
    SDPA packed)."""
    for kind in ("bert", "mpnet"):
        enc = _encoder(kind)
        fusion = _ragged(B=6, T=20, pad_id=enc.pad_token_id)
        real = fusion["attention_mask"].bool()
        weights = torch.randn(int(real.sum()), 32, generator=torch.Generator().manual_seed(2))
        errors = {}
        for packed in (False, True, None):                     # None: the fp32 reference (padded)
            enc.packed = bool(packed)
            enc.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=packed is not None):
                states = enc(fusion).text_states[real].float()
            (states * weights).sum().backward()
            errors[packed] = (states.detach(), torch.cat([p.grad.flatten() for p in enc.parameters() if p.grad is not None]))
        ref_states, ref_grads = errors.pop(None)
        state_err = {k: float((s - ref_states).norm() / ref_states.norm()) for k, (s, _) in errors.items()}
        grad_err = {k: float((g - ref_grads).norm() / ref_grads.norm()) for k, (_, g) in errors.items()}
        assert 0 < state_err[True] <= 1.5 * state_err[False] and 0 < grad_err[True] <= 1.5 * grad_err[False], kind


def test_a_packed_pretraining_step_has_the_padded_losses_and_gradients():
    """model.packed in pretraining (the single-stream encoder, text + visual tokens): steps with ragged step texts and
    missing images, each objective with MLM, the same losses and gradients as padded (fp32), the clean SMRM pass too."""
    from test_pretraining import tiny_module, toy_batch, toy_world

    batch = toy_batch(4, seed=0, world=toy_world())
    batch["input_ids"][:, ::2, 2], batch["attention_mask"][:, ::2, 3] = 102, 0     # even steps: [CLS] object [SEP]
    batch["input_ids"][:, ::2, 3] = 0
    batch["image_mask"][1, 2] = batch["image_mask"][3, 0] = False                  # two steps without an image
    padded, packed = tiny_module("all", generator_scope="sample"), tiny_module("all", generator_scope="sample", packed=True)
    packed.load_state_dict(padded.state_dict())
    assert packed.encoder.packed and not padded.encoder.packed and packed.hparams.packed
    for step, names in enumerate((("mlm", "smrm"), ("mlm", "isp"), ("mlm", "pisp"))):
        results = []
        for module in (padded, packed):
            module.zero_grad()
            loss, _, _ = module.compute_losses(batch, names, step)
            loss.backward()
            results.append((loss.detach(), torch.cat([p.grad.flatten() for p in module.encoder.parameters()
                                                      if p.grad is not None])))
        (loss_a, grads_a), (loss_b, grads_b) = results
        assert abs(float(loss_b - loss_a)) <= 1e-5 * abs(float(loss_a)), names
        assert (grads_b - grads_a).abs().max() <= 1e-5 * grads_a.abs().max(), names


def test_checkpoints_load_across_the_switch():
    padded, packed = _berson("tiny_bert", "joint"), _berson("tiny_bert", "joint", packed=True)
    assert list(padded.state_dict()) == list(packed.state_dict())               # no parameters of its own
    packed.load_state_dict(padded.state_dict(), strict=True)
    assert padded.hparams.packed is False and packed.hparams.packed is True
    old = {k: v for k, v in padded.hparams.items() if k != "packed"}             # a checkpoint from before the switch
    assert BersonModule(**old).encoder.packed is False


def test_the_switch_is_in_the_configs_packed_by_default(compose_train):
    """Packed by default (measured faster on the CPU, docs/results/performance.md); model.packed=false is the padded
    pass.  The class default stays false: a checkpoint from before the switch rebuilds the pass it was trained in."""
    for experiment in ("berson_roc", "berson_finetune", "clipvil_pretrain"):
        assert compose_train(f"experiment={experiment}").model.packed is True
        assert compose_train(f"experiment={experiment}", "model.packed=false").model.packed is False


# ------------------------------------------------------------------ counting the work
@pytest.mark.parametrize("kind", ["bert", "mpnet"])
def test_transformer_flops_equal_the_flop_counter_on_eager_attention(kind):
    """The formula (6 W N + 12 layers H sum L^2 for a training step) is every matmul FlopCounterMode counts in a
    forward + backward of the model with eager attention (whose matmuls it sees; it misses the CPU SDPA kernel)."""
    enc = _encoder(kind, attn_implementation="eager")
    fusion = {"input_ids": torch.randint(1000, 5000, (3, 11)), "attention_mask": torch.ones(3, 11, dtype=torch.long)}
    meter = enc.work_meter = WorkMeter()
    flops = counted_flops(lambda: enc(fusion).text_states.sum().backward())
    work = meter.read()
    assert (work.tokens, work.squares, work.slots, work.passes, work.forward_tokens) == (33, 3 * 11 ** 2, 33, 1, 0)
    shape = transformer_shape(enc.backbone)
    assert shape == {"layers": 2, "hidden": 32, "weights": 2 * (4 * 32 * 32 + 2 * 32 * 64)}
    assert flops == transformer_flops(work.tokens, work.squares, **shape)
    assert transformer_flops(33, 363, **shape, train=False) * 3 == flops


def test_the_meter_counts_real_tokens_whatever_the_path():
    enc = _encoder("bert")
    fusion = _ragged()                                                          # lengths 13, 10, 7, 4
    counts = []
    for packed in (False, True):
        enc.packed = packed
        meter = enc.work_meter = WorkMeter()
        with torch.no_grad():
            enc(fusion)
            meter.active = False
            enc(fusion)                                                         # not counted
        counts.append(meter.read())
    assert counts[0] == counts[1]
    assert (counts[0].tokens, counts[0].squares, counts[0].slots) == (34, 169 + 100 + 49 + 16, 52)
    assert counts[0].padding == pytest.approx(18 / 52)
    shape = transformer_shape(enc.backbone)                                     # no gradients: a forward's FLOPs
    assert counts[0].forward_tokens == 34 and counts[0].flops(shape) == transformer_flops(34, 334, **shape, train=False)
    meter = enc.work_meter = WorkMeter()
    enc(fusion)                                                                 # with gradients: a training step's
    assert meter.read().flops(shape) == transformer_flops(34, 334, **shape) == 3 * counts[0].flops(shape)


def test_every_berson_fit_logs_its_work():
    """A fit gets StepWork from the module: perf/flops_per_step is the formula over the batch's real tokens (pair
    chunks recomputed in backward are not counted twice), tokens/s and padding are logged, MFU only on a GPU."""
    batch = _batch("text", (4, 3), ragged=True)
    results = {}
    for checkpoint_chunks in (False, True):
        module = _berson("tiny_bert", "pairwise")
        module.checkpoint_chunks = checkpoint_chunks
        assert [type(c) for c in module.configure_callbacks()] == [StepWork]
        trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
        trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader([batch, batch], batch_size=None))
        results[checkpoint_chunks] = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("perf/")}
        assert module.encoder.work_meter is None                                 # detached after the fit
    meter = module.encoder.work_meter = WorkMeter()
    with torch.no_grad():
        module.encode(batch)
    work = meter.read()
    expected = transformer_flops(work.tokens, work.squares, **transformer_shape(module.encoder.backbone))
    for metrics in results.values():
        assert set(metrics) == {"perf/flops_per_step", "perf/tokens_per_s", "perf/padding"}
        assert metrics["perf/flops_per_step"] == pytest.approx(expected, rel=1e-6)
        assert metrics["perf/tokens_per_s"] > 0 and metrics["perf/padding"] == pytest.approx(work.padding)


def test_gpu_peaks_and_machine_names():
    assert gpu_peak_flops("NVIDIA H200") == gpu_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert gpu_peak_flops("NVIDIA H100 PCIe") == 756e12 and gpu_peak_flops("NVIDIA L40S") == 362e12
    assert gpu_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12 and gpu_peak_flops("NVIDIA L4") == 121e12
    assert gpu_peak_flops("Tesla T4") is None
    assert machine("cpu").endswith(" cores") and len(machine()) > len(" cores")
