"""float32 master weights for half-precision parameters (``trainer.precision=bf16-true``).

Under ``bf16-mixed`` the parameters stay float32 and autocast casts them to bfloat16 at every matmul:
on a GPU that is one copy kernel per weight use, forward and backward (1,428 a step for paper-size
pretraining, docs/results/performance.md). Under Lightning's ``bf16-true`` the module itself is
bfloat16 (no casts), but a plain optimizer then updates bfloat16 weights, and an update smaller than
half a bfloat16 step (2^-9 of the weight) is rounded away: with AdamW at lr 1e-4 most of a
pretrained encoder's updates are.

:class:`MasterWeights` keeps the optimizer's copy in float32 (mixed-precision training as in
Micikevicius et al. 2018, without loss scaling, which bfloat16's range does not need):

* the optimizer is built on float32 *master* tensors, one per trainable half-precision parameter,
  so its state, clipping and learning-rate schedule all see float32;
* before each step :meth:`grads_to_master` copies the half-precision gradients into the masters'
  ``.grad`` (a parameter without a gradient gives its master none, so the optimizer skips it, as it
  would the parameter) and frees them;
* after each step :meth:`params_from_master` rounds the masters back into the module's parameters.

:class:`~seqaware.modules.base.SeqawareModule` does this for every module when the trainer's precision
plugin is Lightning's ``HalfPrecision``, and writes the masters (not the rounded weights) into its
checkpoints, so a resumed run continues exactly and a checkpoint's weights are float32 whatever the
precision it was trained in. ``scripts/bench/bench_pretrain.py --precision bf16-true`` uses the same class.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Optional

import torch
from torch import nn

HALF_DTYPES = (torch.bfloat16, torch.float16)


class MasterWeights:
    """float32 copies of half-precision parameters for the optimizer (see the module docstring).

    Build it with :meth:`for_param_groups`; parameters already in float32 are their own masters
    (nothing to copy), so a module with a few float32 layers left (e.g. frozen statistics) works too.
    """

    def __init__(self, pairs: list[tuple[nn.Parameter, torch.Tensor]]):
        self.pairs = [(p, m) for p, m in pairs if m is not p]  # the ones that need copying
        self._master_of = {id(p): m for p, m in pairs}
        # name -> float32 value of a frozen parameter or buffer from before the conversion (see keep_frozen)
        self.frozen: dict[str, torch.Tensor] = {}

    def keep_frozen(self, values: Mapping[str, torch.Tensor]) -> None:
        """Remember the float32 values of frozen parameters and buffers (``name -> tensor``, taken
        before the module was converted): :meth:`state_dict_update` writes them instead of their
        half-precision rounding as long as the module's value is still that rounding."""
        self.frozen = dict(values)

    @classmethod
    def for_param_groups(cls, groups: list[dict],
                         sources: Optional[Mapping[int, torch.Tensor]] = None) -> tuple["MasterWeights", list[dict]]:
        """``(master weights, the same groups over the masters)``.

        ``sources``: ``id(parameter) -> float32 tensor`` holding the parameter's exact value from before
        it was rounded to half precision (see :meth:`SeqawareModule.configure_model`); without one the
        master starts from the half-precision value.
        """
        sources = sources or {}
        pairs, new_groups = [], []
        for group in groups:
            masters = []
            for p in group["params"]:
                if p.dtype in HALF_DTYPES:
                    src = sources.get(id(p))
                    if src is not None and src.shape != p.shape:
                        raise ValueError(f"master weight source of shape {tuple(src.shape)} for a parameter of "
                                         f"shape {tuple(p.shape)}")
                    src = src if src is not None else p.detach()
                    master = src.detach().to(device=p.device, dtype=torch.float32, copy=True)
                else:
                    master = p
                pairs.append((p, master))
                masters.append(master)
            new_groups.append({**group, "params": masters})
        return cls(pairs), new_groups

    def __len__(self) -> int:
        return len(self.pairs)

    def master(self, param: nn.Parameter) -> torch.Tensor:
        """The float32 tensor the optimizer updates for ``param`` (``param`` itself when it is float32)."""
        return self._master_of[id(param)]

    @torch.no_grad()
    def grads_to_master(self) -> None:
        """Copy each parameter's gradient into its master's ``.grad`` (float32) and free it; a parameter
        without a gradient leaves its master without one (the optimizer skips it)."""
        dst, src = [], []
        for p, m in self.pairs:
            if p.grad is None:
                m.grad = None
                continue
            if m.grad is None:
                m.grad = torch.empty_like(m)
            dst.append(m.grad)
            src.append(p.grad)
        if dst:
            torch._foreach_copy_(dst, src)
        for p, _ in self.pairs:
            p.grad = None

    @torch.no_grad()
    def params_from_master(self) -> None:
        """Round every master into its half-precision parameter (after an optimizer step)."""
        if self.pairs:
            torch._foreach_copy_([p for p, _ in self.pairs], [m for _, m in self.pairs])

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Round the masters into the parameters after every ``optimizer.step()``."""
        optimizer.register_step_post_hook(lambda *_: self.params_from_master())

    def state_dict_update(self, named: Iterable[tuple[str, nn.Parameter]], state: dict) -> dict:
        """``state`` (a module state dict) with each half-precision parameter's entry replaced by its
        float32 master, and each unchanged frozen entry by its float32 value (:meth:`keep_frozen`), on
        the entry's device."""
        for name, p in named:
            master = self._master_of.get(id(p))
            if master is not None and master is not p and name in state:
                state[name] = master.detach().to(state[name].device, copy=True)
        for name, value in self.frozen.items():
            current = state.get(name)
            if (current is not None and current.dtype in HALF_DTYPES and current.shape == value.shape
                    and torch.equal(current, value.to(current.device, current.dtype))):
                state[name] = value.detach().to(current.device, copy=True)
        return state


def precision_plugin(precision: str, device: torch.device):
    """Lightning's plugin for ``trainer.precision=precision`` (``32-true`` | ``bf16-mixed`` | ``bf16-true``), for
    code that steps a module without a Trainer (the benchmarks): its ``convert_module``, ``convert_input`` and
    ``forward_context`` (autocast, or the bfloat16 default dtype of ``bf16-true``) are what the Trainer applies."""
    from pytorch_lightning.plugins.precision import HalfPrecision, MixedPrecision, Precision

    if precision == "bf16-mixed":
        return MixedPrecision("bf16-mixed", device.type)
    if precision == "bf16-true":
        return HalfPrecision("bf16-true")
    if precision == "32-true":
        return Precision()
    raise ValueError(f"precision must be 32-true, bf16-mixed or bf16-true, got {precision!r}")
