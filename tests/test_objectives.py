"""Pretraining objectives: corruption exactness, SMRM loss by hand, forward/backward, turn-taking."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from seqaware.objectives import (
    OBJECTIVE_SETS,
    OBJECTIVES,
    EncoderOutput,
    ImageSwapPrediction,
    MaskedLanguageModeling,
    ObjectiveSchedule,
    PatchSwapPrediction,
    SequentialMaskedRegionModeling,
    build_objective,
    check_objectives,
)

VOCAB, MASK_ID, PAD_ID, CLS_ID, SEP_ID = 50, 1, 0, 2, 3
H, D = 16, 12


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_batch(B=4, S=4, P=9, step_len=(3, 8), seed=0, image_prob=0.8, text=True):
    """A random fusion input: [CLS] step tokens [SEP] ... [PAD]; some steps without an image."""
    g = gen(seed)
    batch = {}
    if text:
        rows_ids, rows_steps = [], []
        for _ in range(B):
            ids, steps = [CLS_ID], [-1]
            for s in range(S):
                n = int(torch.randint(step_len[0], step_len[1] + 1, (1,), generator=g))
                ids += torch.randint(4, VOCAB, (n,), generator=g).tolist() + [SEP_ID]
                steps += [s] * n + [-1]
            rows_ids.append(ids)
            rows_steps.append(steps)
        T = max(map(len, rows_ids)) + 2
        input_ids = torch.full((B, T), PAD_ID)
        text_step = torch.full((B, T), -1)
        attention_mask = torch.zeros(B, T, dtype=torch.long)
        for b, (ids, steps) in enumerate(zip(rows_ids, rows_steps)):
            input_ids[b, :len(ids)] = torch.tensor(ids)
            text_step[b, :len(steps)] = torch.tensor(steps)
            attention_mask[b, :len(ids)] = 1
        batch.update(input_ids=input_ids, attention_mask=attention_mask, text_step=text_step)
    batch["visual_feats"] = torch.randn(B, S, P, D, generator=g)
    batch["visual_mask"] = torch.rand(B, S, generator=g) < image_prob
    return batch


class TinyEncoder(nn.Module):
    """A single-stream encoder implementing the fusion-input / EncoderOutput interface."""

    def __init__(self, vocab=VOCAB, feat_dim=D, hidden=H):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.cls = nn.Parameter(torch.randn(hidden) * 0.02)
        self.visual_proj = nn.Sequential(nn.Linear(feat_dim, hidden), nn.LayerNorm(hidden))
        layer = nn.TransformerEncoderLayer(hidden, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.transformer = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.lm_head = nn.Linear(hidden, vocab)

    def forward(self, batch: dict) -> EncoderOutput:
        feats = batch["visual_feats"]
        B, S, P, _ = feats.shape
        parts = [self.cls.expand(B, 1, -1)]
        keep = [torch.ones(B, 1, dtype=torch.bool)]
        T = 0
        if "input_ids" in batch:
            T = batch["input_ids"].shape[1]
            parts.append(self.tok(batch["input_ids"]))
            keep.append(batch["attention_mask"].bool())
        projected = self.visual_proj(feats)
        parts.append(projected.reshape(B, S * P, -1))
        vis_keep = batch["visual_mask"].bool()[..., None].expand(B, S, P)
        if batch.get("patch_mask") is not None:
            vis_keep = vis_keep & batch["patch_mask"].bool()
        keep.append(vis_keep.reshape(B, S * P))
        states = self.transformer(torch.cat(parts, 1), src_key_padding_mask=~torch.cat(keep, 1))
        return EncoderOutput(cls=states[:, 0], text_states=states[:, 1:1 + T] if T else None,
                             patch_states=states[:, 1 + T:].reshape(B, S, P, -1), projected_visual=projected)


# ------------------------------------------------------------------------------------------ ISP

def test_isp_labels_match_what_was_swapped():
    isp = ImageSwapPrediction(H)
    swapped_total, eligible_total = 0, 0
    for seed in range(40):
        batch = make_batch(B=16, S=4, seed=seed, text=False)
        original = {k: v.clone() for k, v in batch.items()}
        out, tgt = isp.corrupt(batch, gen(seed))
        assert all(torch.equal(batch[k], original[k]) for k in batch)  # never in place
        changed = (out["visual_feats"] != batch["visual_feats"]).any(-1).any(-1)  # (B, S)
        labels = tgt["isp_labels"]
        n_images = batch["visual_mask"].sum(1)
        for b in range(16):
            if labels[b] == 1:
                i, j = tgt["isp_steps"][b].tolist()
                assert i != j and batch["visual_mask"][b, i] and batch["visual_mask"][b, j]
                assert changed[b].nonzero().flatten().tolist() == sorted([i, j])
                assert torch.equal(out["visual_feats"][b, i], batch["visual_feats"][b, j])
                assert torch.equal(out["visual_feats"][b, j], batch["visual_feats"][b, i])
            else:
                assert not changed[b].any() and tgt["isp_steps"][b].tolist() == [-1, -1]
            assert torch.equal(out["visual_mask"][b], batch["visual_mask"][b])
        assert not labels[n_images < 2].any()  # never swaps with < 2 images
        swapped_total += int(labels.sum())
        eligible_total += int((n_images >= 2).sum())
    assert abs(swapped_total / eligible_total - 0.5) < 0.07


def test_isp_moves_visual_mask_and_patch_mask_with_images():
    batch = make_batch(B=64, S=3, P=5, text=False, image_prob=1.0, seed=1)
    batch["patch_mask"] = torch.rand(64, 3, 5, generator=gen(2)) < 0.7
    out, tgt = ImageSwapPrediction(H, delta=1.0).corrupt(batch, gen(3))
    assert tgt["isp_labels"].all()
    rows = torch.arange(64)
    i, j = tgt["isp_steps"].unbind(1)
    assert torch.equal(out["patch_mask"][rows, i], batch["patch_mask"][rows, j])
    assert torch.equal(out["patch_mask"][rows, j], batch["patch_mask"][rows, i])


# ----------------------------------------------------------------------------------------- PISP

@pytest.mark.parametrize("w", [1, 3, 7])
def test_pisp_swaps_exactly_the_chosen_patches(w):
    pisp = PatchSwapPrediction(H, max_patches=w)
    seen_m = set()
    for seed in range(10):
        batch = make_batch(B=32, S=4, P=9, seed=seed, text=False)
        out, tgt = pisp.corrupt(batch, gen(seed + 100))
        before, after = batch["visual_feats"], out["visual_feats"]
        swapped = tgt["pisp_swapped"]
        changed = (before != after).any(-1)
        assert torch.equal(changed, swapped)  # every other feature is identical
        for b in range(32):
            m = int(tgt["pisp_num_patches"][b])
            if tgt["pisp_labels"][b] == 0:
                assert m == 0 and not swapped[b].any()
                continue
            assert 1 <= m <= w
            seen_m.add(m)
            i, j = tgt["pisp_steps"][b].tolist()
            assert swapped[b].sum(-1).nonzero().flatten().tolist() == sorted([i, j])
            assert int(swapped[b, i].sum()) == m and int(swapped[b, j].sum()) == m
            # the M patches of image i now hold exactly the M selected patches of image j, and back
            got_i = {tuple(v.tolist()) for v in after[b, i][swapped[b, i]]}
            assert got_i == {tuple(v.tolist()) for v in before[b, j][swapped[b, j]]}
            got_j = {tuple(v.tolist()) for v in after[b, j][swapped[b, j]]}
            assert got_j == {tuple(v.tolist()) for v in before[b, i][swapped[b, i]]}
    assert seen_m == set(range(1, w + 1))


def test_pisp_respects_patch_mask():
    batch = make_batch(B=64, S=3, P=9, text=False, image_prob=1.0)
    batch["patch_mask"] = torch.rand(64, 3, 9, generator=gen(5)) < 0.5
    out, tgt = PatchSwapPrediction(H, delta=1.0, max_patches=7).corrupt(batch, gen(6))
    assert not (tgt["pisp_swapped"] & ~batch["patch_mask"]).any()
    assert torch.equal((out["visual_feats"] != batch["visual_feats"]).any(-1), tgt["pisp_swapped"])


def test_pisp_paper_default_draws_m_uniform_in_1_to_w():
    # Wu et al. 2022, sec. 4.2.2: M ranges from 1 to w, w = the image's number of patches
    pisp = PatchSwapPrediction(H, delta=1.0)
    assert pisp.max_patches is None
    P = 4
    batch = make_batch(B=4000, S=2, P=P, seed=1, text=False, image_prob=1.0)
    _, tgt = pisp.corrupt(batch, gen(11))
    m = tgt["pisp_num_patches"]
    assert tgt["pisp_labels"].all()
    assert int(m.min()) == 1 and int(m.max()) == P          # both bounds reached, nothing above w
    counts = torch.bincount(m, minlength=P + 1)[1:].double()
    # uniform: each of the 4 values ~1000 times (binomial sd ~27)
    assert ((counts - 1000).abs() < 150).all(), counts
    assert torch.equal(tgt["pisp_swapped"].sum((1, 2)), 2 * m)


def test_pisp_paper_default_reaches_w_above_the_old_cap_and_respects_real_patches():
    P = 16
    batch = make_batch(B=3000, S=3, P=P, seed=2, text=False, image_prob=1.0)
    _, tgt = PatchSwapPrediction(H, delta=1.0).corrupt(batch, gen(12))
    m = tgt["pisp_num_patches"]
    assert int(m.min()) == 1 and int(m.max()) == P and int((m > 7).sum()) > 1000  # ~9/16 of 3000
    # with a patch mask, w = the smaller number of real patches of the two images
    batch["patch_mask"] = torch.rand(3000, 3, P, generator=gen(13)) < 0.6
    batch["patch_mask"][:, :, 0] = True  # every image keeps >= 1 real patch
    _, tgt = PatchSwapPrediction(H, delta=1.0).corrupt(batch, gen(14))
    rows = torch.arange(3000)
    i, j = tgt["pisp_steps"].unbind(1)
    w = torch.minimum(batch["patch_mask"][rows, i].sum(1), batch["patch_mask"][rows, j].sum(1))
    m = tgt["pisp_num_patches"]
    assert (m >= 1).all() and (m <= w).all()
    assert int((m == w).sum()) > 100 and int((m == 1).sum()) > 100
    assert not (tgt["pisp_swapped"] & ~batch["patch_mask"]).any()


def test_pisp_capped_option_keeps_the_old_rule():
    batch = make_batch(B=2000, S=2, P=16, seed=3, text=False, image_prob=1.0)
    _, tgt = PatchSwapPrediction(H, delta=1.0, max_patches=7).corrupt(batch, gen(15))
    m = tgt["pisp_num_patches"]
    assert int(m.min()) == 1 and int(m.max()) == 7
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_patches"):
            PatchSwapPrediction(H, max_patches=bad)


@pytest.mark.parametrize("max_patches", [None, 7])
def test_pisp_corrupt_is_vectorised_over_the_batch(max_patches):
    """The number of tensor operations does not grow with the batch size (no Python loop over samples)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += 1
            return func(*args, **(kwargs or {}))

    pisp = PatchSwapPrediction(H, delta=1.0, max_patches=max_patches)
    counts = []
    for B in (2, 64):
        batch = make_batch(B=B, S=3, P=9, seed=4, text=False, image_prob=1.0)
        batch["patch_mask"] = torch.rand(B, 3, 9, generator=gen(5)) < 0.7
        with CountOps() as mode:
            pisp.corrupt(batch, gen(6))
        counts.append(mode.count)
    assert counts[0] == counts[1] and counts[0] > 10


# ----------------------------------------------------------------------------------------- SMRM

def pairwise_overlaps(mask: torch.Tensor, visual_mask: torch.Tensor):
    B, S, _ = mask.shape
    for b in range(B):
        for s, t in itertools.combinations(range(S), 2):
            if visual_mask[b, s] and visual_mask[b, t]:
                yield int((mask[b, s] & mask[b, t]).sum())


def test_smrm_masks_exactly_the_chosen_patches():
    smrm = SequentialMaskedRegionModeling(H)
    batch = make_batch(B=8, S=5, P=49, text=False)
    out, tgt = smrm.corrupt(batch, gen(1))
    mask = tgt["smrm_mask"]
    assert torch.equal(mask.sum(-1), batch["visual_mask"].long() * 7)  # round(0.15 * 49) = 7 per image
    assert (out["visual_feats"][mask] == 0).all()
    assert torch.equal(out["visual_feats"][~mask], batch["visual_feats"][~mask])


@pytest.mark.parametrize("S,P,ratio", [(4, 49, 0.15), (12, 49, 0.15), (3, 16, 0.5), (8, 196, 0.15), (3, 10, 0.3)])
def test_smrm_overlap_bound_every_pair(S, P, ratio):
    smrm = SequentialMaskedRegionModeling(H, mask_ratio=ratio)
    k = smrm.masked_per_image(P)
    for seed in range(5):
        batch = make_batch(B=16, S=S, P=P, seed=seed, text=False, image_prob=0.9)
        _, tgt = smrm.corrupt(batch, gen(seed))
        overlaps = list(pairwise_overlaps(tgt["smrm_mask"], batch["visual_mask"]))
        assert overlaps and all(o < k / 2 for o in overlaps)


@pytest.mark.parametrize("ratio,num_masked", [(0.15, None), (0.3, None), (None, 2)])
def test_smrm_masks_only_real_regions_and_every_image_gets_its_share(ratio, num_masked):
    """Padded region slots (VisualBERT: whole image + up to R boxes) are never masked, and each
    image still gets k_b = max(1, round(ratio * P_b)) masked regions, P_b the slots real in every
    image of the sample (Wu et al. sec. 4.2.3: the same X% for each image); the overlap bound holds."""
    kwargs = {"num_masked": num_masked} if num_masked is not None else {"mask_ratio": ratio}
    smrm = SequentialMaskedRegionModeling(H, **kwargs)
    B, S, P = 32, 2, 9
    for seed in range(4):
        batch = make_batch(B=B, S=S, P=P, seed=seed, text=False, image_prob=1.0)
        real = torch.randint(2, P + 1, (B, S), generator=gen(seed + 10))  # 1 whole-image token + >= 1 box
        batch["patch_mask"] = torch.arange(P) < real[..., None]
        _, tgt = smrm.corrupt(batch, gen(seed))
        mask = tgt["smrm_mask"]
        assert not (mask & ~batch["patch_mask"]).any()
        common = real.min(dim=1).values
        if num_masked is not None:
            expected = torch.minimum(torch.full_like(common, num_masked), common // 2)
        else:
            k = smrm.masked_per_image(P)
            expected = torch.minimum((common * ratio).round().long().clamp(min=1, max=k), common // 2)
        assert torch.equal(mask.sum(-1), expected[:, None].expand(B, S))
        overlap = (mask[:, 0] & mask[:, 1]).sum(-1)
        assert (overlap < expected / 2).all()  # < k_b / 2 for every pair (0 when k_b = 1)


def test_smrm_too_many_images_is_a_clear_error():
    batch = make_batch(B=2, S=13, P=49, text=False, image_prob=1.0)
    with pytest.raises(ValueError, match="at most 12 images"):
        SequentialMaskedRegionModeling(H).corrupt(batch, gen(0))


def test_smrm_region_slots_too_few_for_the_overlap_bound_spread_the_masks(caplog):
    """5 images with 3 real region slots each (a whole-image token + 2 boxes, the synthetic world under
    hparams=wu2022): 1 masked slot per image, offsets floor(r * 3 / 5) = 0, 0, 1, 1, 2 over a random
    order of the slots, so every slot is masked and none more than twice; a warning says so, once."""
    import logging

    batch = make_batch(B=4, S=5, P=8, text=False, image_prob=1.0)
    batch["patch_mask"] = (torch.arange(8) < 3).expand(4, 5, 8).clone()
    with caplog.at_level(logging.WARNING, logger="seqaware.objectives.smrm"):
        for seed in range(3):
            _, tgt = SequentialMaskedRegionModeling(H).corrupt(batch, gen(seed))
            mask = tgt["smrm_mask"]
            assert not (mask & ~batch["patch_mask"]).any() and (mask.sum(-1) == 1).all()
            per_slot = mask.sum(1)[:, :3]  # (B, 3): images masking each slot
            assert (per_slot.sort(-1).values == torch.tensor([1, 2, 2])).all()
    assert sum("cannot keep the masked slots" in r.getMessage() for r in caplog.records) <= 1


def tiny_smrm_setup(scope):
    torch.manual_seed(0)
    smrm = SequentialMaskedRegionModeling(4, num_masked=2, vocab_scope=scope, score_hidden=5)
    batch = make_batch(B=3, S=3, P=6, text=False, image_prob=1.0)
    batch["visual_mask"][2, 1:] = False  # sample 2 has a single image
    batch["visual_feats"] = batch["visual_feats"][..., :4]
    _, tgt = smrm.corrupt(batch, gen(4))
    outputs = EncoderOutput(cls=torch.randn(3, 4), patch_states=torch.randn(3, 3, 6, 4, requires_grad=True))
    target_states = torch.randn(3, 3, 6, 4)
    return smrm, tgt, outputs, target_states


@pytest.mark.parametrize("scope", ["sequence", "batch", "global"])
def test_smrm_loss_matches_hand_computation(scope):
    smrm, tgt, outputs, target_states = tiny_smrm_setup(scope)
    loss, logs = smrm(outputs, tgt, target_states=target_states, generator=gen(9))
    mask = tgt["smrm_mask"]
    positions = mask.nonzero().tolist()
    losses, sizes = [], []
    for b, s, p in positions:
        # candidates: masked target states of the same sample (sequence) or of the whole batch
        cands = [(b2, s2, p2) for b2, s2, p2 in positions if scope != "sequence" or b2 == b]
        q = outputs.patch_states[b, s, p]
        scores = torch.stack([smrm.scorer(torch.cat([q, target_states[c]])).squeeze() for c in cands])
        losses.append(-F.log_softmax(scores, 0)[cands.index((b, s, p))])
        sizes.append(len(cands))
    expected = torch.stack(losses).mean()
    assert torch.allclose(loss, expected, atol=1e-5)
    assert logs["smrm_num_candidates"] == pytest.approx(sum(sizes) / len(sizes))
    loss.backward()
    assert outputs.patch_states.grad.abs().sum() > 0


@pytest.mark.parametrize("scope", ["sequence", "batch"])
def test_smrm_gradients_are_bitwise_repeatable_with_threads(scope):
    """Two identical SMRM backward passes give identical gradients on a multi-threaded CPU: the
    candidate projection is broadcast / index_select-ed, not gathered by advanced indexing (whose
    backward adds repeated indices in a thread-dependent order; the README's main job printed
    different SMRM / PMR figures for one seed before)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 2))
    try:
        g = torch.Generator().manual_seed(0)
        smrm = SequentialMaskedRegionModeling(hidden_size=64, mask_ratio=0.25, vocab_scope=scope)
        B, S, P = 8, 4, 16
        batch = {"visual_feats": torch.randn(B, S, P, 8, generator=g), "visual_mask": torch.ones(B, S, dtype=torch.bool)}
        _, tgt = smrm.corrupt(batch, gen(1))
        states = torch.randn(B, S, P, 64, generator=g)
        target_states = torch.randn(B, S, P, 64, generator=g)

        def grads():
            smrm.zero_grad(set_to_none=True)
            queries = states.clone().requires_grad_(True)
            loss, _ = smrm(EncoderOutput(cls=torch.zeros(B, 64), patch_states=queries), tgt,
                           target_states=target_states, generator=gen(2))
            loss.backward()
            return [queries.grad] + [p.grad.clone() for p in smrm.parameters()]

        first = grads()
        for _ in range(4):
            assert all(torch.equal(a, b) for a, b in zip(first, grads()))
    finally:
        torch.set_num_threads(threads)


def test_smrm_candidate_counts_sequence_vs_batch():
    results = {}
    for scope in ("sequence", "batch"):
        smrm, tgt, outputs, target_states = tiny_smrm_setup(scope)
        bank, valid, group, gold = smrm._candidates(target_states[tgt["smrm_mask"]],
                                                    torch.arange(3)[:, None, None].expand(3, 3, 6)[tgt["smrm_mask"]], 3)
        # the candidate set is exactly the masked positions' target states, gold points at one's own
        cands = bank[group, gold]
        assert torch.equal(cands, target_states[tgt["smrm_mask"]])
        results[scope] = valid[group].sum(1)
    per_sample = tgt["smrm_mask"].sum((1, 2))  # 6, 6, 2 masked patches
    assert results["sequence"].tolist() == per_sample.repeat_interleave(per_sample).tolist()
    assert (results["batch"] == per_sample.sum()).all()


def test_smrm_global_scope_with_a_process_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        smrm, tgt, outputs, target_states = tiny_smrm_setup("global")
        loss, logs = smrm(outputs, tgt, target_states=target_states, generator=gen(1))
        batch_smrm = tiny_smrm_setup("batch")[0]
        batch_smrm.load_state_dict(smrm.state_dict())
        loss_b, logs_b = batch_smrm(outputs, tgt, target_states=target_states, generator=gen(1))
        assert torch.allclose(loss, loss_b) and logs["smrm_num_candidates"] == logs_b["smrm_num_candidates"]
    finally:
        dist.destroy_process_group()


def test_smrm_target_selection():
    out = EncoderOutput(cls=torch.zeros(1, 2), patch_states=torch.ones(1, 1, 1, 2),
                        projected_visual=torch.zeros(1, 1, 1, 2))
    assert SequentialMaskedRegionModeling(2, target="output").select_target_states(out).sum() == 2
    assert SequentialMaskedRegionModeling(2, target="input").select_target_states(out).sum() == 0
    with pytest.raises(ValueError):
        SequentialMaskedRegionModeling(2, target="middle")


# ------------------------------------------------------------------------------------------ MLM

def make_mlm(p=0.15):
    return MaskedLanguageModeling(H, VOCAB, MASK_ID, mask_prob=p, special_token_ids=(PAD_ID, CLS_ID, SEP_ID))


@pytest.mark.parametrize("p", [0.15, 0.4])
def test_mlm_balanced_per_step(p):
    mlm = make_mlm(p)
    batch = make_batch(B=32, S=5, step_len=(1, 20), seed=3)
    original = batch["input_ids"].clone()
    _, tgt = mlm.corrupt(batch, gen(7))
    assert torch.equal(batch["input_ids"], original)
    selected = tgt["mlm_labels"] != -100
    for b in range(32):
        for s in range(5):
            n = int(((batch["text_step"][b] == s) & batch["attention_mask"][b].bool()).sum())
            count = int((selected[b] & (batch["text_step"][b] == s)).sum())
            want = max(1, round(p * n))
            assert abs(count - want) <= 1 and count >= 1
    specials = torch.isin(batch["input_ids"], torch.tensor([PAD_ID, CLS_ID, SEP_ID])) | (batch["text_step"] < 0)
    assert not (selected & specials).any()
    assert torch.equal(tgt["mlm_labels"][selected], batch["input_ids"][selected])


def test_mlm_never_masks_special_tokens_inside_a_step():
    """[SEP] closing a step's text belongs to the step (text_step >= 0) but is a special token: with
    mask_prob 1 every other token of the step is masked, the [SEP]s never."""
    ids = torch.tensor([[CLS_ID, 11, 12, SEP_ID, 13, 14, SEP_ID, PAD_ID]])
    batch = {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]]),
             "text_step": torch.tensor([[-1, 0, 0, 0, 1, 1, 1, -1]])}
    _, tgt = make_mlm(1.0).corrupt(batch, gen(0))
    assert tgt["mlm_labels"].tolist() == [[-100, 11, 12, -100, 13, 14, -100, -100]]


def test_mlm_80_10_10():
    mlm = make_mlm(0.3)
    batch = make_batch(B=64, S=4, step_len=(10, 30), seed=5)
    out, tgt = mlm.corrupt(batch, gen(11))
    selected = tgt["mlm_labels"] != -100
    new, old = out["input_ids"][selected], batch["input_ids"][selected]
    n = selected.sum().item()
    frac_mask = (new == MASK_ID).float().mean().item()
    frac_same = (new == old).float().mean().item()
    frac_random = 1 - frac_mask - frac_same
    assert n > 1500
    assert abs(frac_mask - 0.8) < 0.04 and abs(frac_same - 0.1) < 0.03 and abs(frac_random - 0.1) < 0.03
    assert torch.equal(out["input_ids"][~selected], batch["input_ids"][~selected])


def test_mlm_uses_given_lm_head():
    head = nn.Linear(H, VOCAB)
    mlm = MaskedLanguageModeling(H, VOCAB, MASK_ID, lm_head=head)
    assert mlm.lm_head is head


# ---------------------------------------------------------------------- forward / backward, all

def build(name, encoder):
    kwargs = {"hidden_size": H}
    if name == "mlm":
        kwargs.update(vocab_size=VOCAB, mask_token_id=MASK_ID, special_token_ids=(PAD_ID, CLS_ID, SEP_ID),
                      lm_head=encoder.lm_head)
    return build_objective(name, **kwargs)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_forward_backward_reaches_encoder(name):
    torch.manual_seed(0)
    encoder = TinyEncoder()
    objective = build(name, encoder)
    batch = make_batch(B=4, S=4, P=9, image_prob=1.0)
    corrupted, targets = objective.corrupt(batch, gen(0))
    extra = {}
    if objective.needs_clean_pass:
        with torch.no_grad():
            extra["target_states"] = objective.select_target_states(encoder(batch))
    loss, logs = objective(encoder(corrupted), targets, **extra)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert {f"{name}_loss", f"{name}_acc"} <= set(logs)
    loss.backward()
    grads = [p.grad for p in encoder.transformer.parameters() if p.grad is not None]
    assert grads and sum(float(g.abs().sum()) for g in grads) > 0
    if "image" in objective.modalities:
        assert encoder.visual_proj[0].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_every_objective_declares_what_it_corrupts_and_changes_nothing_else(name):
    """The order of corruptions rests on each objective's ``corrupts``: declared, known, and kept."""
    from seqaware.objectives.base import CORRUPTIONS
    from seqaware.objectives.corruption import check_corruption

    objective = build(name, TinyEncoder())
    assert type(objective).corrupts is not None and set(type(objective).corrupts) <= set(CORRUPTIONS), name
    batch = make_batch(B=4, S=4, P=9, image_prob=1.0)
    corrupted, _ = objective.corrupt(batch, gen(1))
    check_corruption(objective, batch, corrupted)  # raises on an undeclared change
    assert any(corrupted[k] is not batch.get(k) for k in corrupted) == bool(type(objective).corrupts), name


def test_objectives_are_deterministic_given_the_generator():
    batch = make_batch(B=8, S=4, P=9)
    for name in sorted(OBJECTIVES):
        objective = build(name, TinyEncoder())
        (a, ta), (b, tb) = objective.corrupt(batch, gen(3)), objective.corrupt(batch, gen(3))
        assert all(torch.equal(a[k], b[k]) for k in a) and all(torch.equal(ta[k], tb[k]) for k in ta)


# ------------------------------------------------------------------------------------- schedule

def test_schedule_same_draw_for_same_seed_and_step():
    a, b = ObjectiveSchedule("all", seed=7), ObjectiveSchedule(["mlm", "isp", "pisp", "smrm"], seed=7)
    draws = [a.draw(step) for step in range(300)]
    assert draws == [b.draw(step) for step in range(300)]
    assert all(d[0] == "mlm" and len(d) == 2 for d in draws)
    counts = {n: sum(d[1] == n for d in draws) for n in ("isp", "pisp", "smrm")}
    assert all(abs(c - 100) < 30 for c in counts.values())
    assert draws != [ObjectiveSchedule("all", seed=8).draw(step) for step in range(300)]


def test_schedule_without_mlm_and_mlm_only():
    assert all(len(ObjectiveSchedule("isp_pisp").draw(s)) == 1 for s in range(10))
    assert ObjectiveSchedule("mlm").draw(5) == ("mlm",)


def test_registered_objectives_include_the_built_ins_and_unknown_names_list_them():
    assert {"mlm", "isp", "pisp", "smrm"} <= set(OBJECTIVES)
    assert OBJECTIVES.where("smrm") == "seqaware.objectives.smrm:SequentialMaskedRegionModeling"
    with pytest.raises(ValueError) as err:
        build_objective("nsp", hidden_size=H)
    assert str(err.value) == f"unknown objective 'nsp'; registered: {', '.join(sorted(OBJECTIVES))}"


def test_check_objectives():
    assert {"mlm", "mlm_isp", "mlm_smrm", "mlm_isp_pisp", "mlm_isp_smrm", "all", "isp", "isp_pisp",
            "isp_pisp_smrm"} <= set(OBJECTIVE_SETS)
    for name, names in OBJECTIVE_SETS.items():
        assert check_objectives(name, "multimodal") == names
    with pytest.raises(ValueError, match="image-only"):
        check_objectives("mlm_isp", "image")
    with pytest.raises(ValueError, match="image-only"):
        check_objectives(["mlm"], "image")
    assert check_objectives("isp_pisp_smrm", "image") == ("isp", "pisp", "smrm")
    with pytest.raises(ValueError, match="text-only"):
        check_objectives("mlm_isp", "text")
    with pytest.raises(ValueError, match="unknown"):
        check_objectives(["mlm", "nsp"], "multimodal")
    assert math.isclose(len(OBJECTIVE_SETS["all"]), 4)
