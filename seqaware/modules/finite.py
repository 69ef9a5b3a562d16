"""Non-finite losses and gradients: a fit stops at the first one (or skips that step, counted).

Every :class:`~seqaware.modules.base.SeqawareModule` checks, at every training step,

* the loss its ``training_step`` returns and every loss term it logs in that step (a logged key with
  ``loss`` in its name: ``train/loss``, ``train/pair_loss``, ``train/mlm_loss``, ...), before the backward
  pass; the step's logs are held back until the check passes, so a skipped step logs nothing of its own;
* the gradients, after the backward pass and before the optimizer step (a finite loss can still give an
  inf gradient); not under ``16-mixed``, whose gradient scaler already skips such steps and lowers its scale.

``callbacks.nonfinite_loss.action`` (:class:`seqaware.callbacks.NonFiniteLoss`) chooses what happens:

``stop`` (default)
    :class:`NonFiniteLossError` is raised before anything of that step reaches the weights. Its message names
    the step, each non-finite term and the term's last finite value; ``train.py`` records the run as
    ``failed`` with it, and since the fit ends by an exception nothing is exported (no ``encoder.pt``, LoRA
    adapter or merged model), no checkpoint is written after it and no test runs.
``skip``
    the step changes nothing (no backward pass, or every gradient dropped so the optimizer leaves every
    weight and its state as they were), a warning names it, and ``train/nonfinite_skips`` (logged at every
    step) counts the skips; the count is saved in checkpoints, so a resumed run goes on counting.

Under several processes the decision is all-reduced, so every rank stops or skips the same step.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Mapping, Optional

import torch

logger = logging.getLogger(__name__)

ACTIONS = ("stop", "skip")
SKIPS_KEY = "train/nonfinite_skips"
SWITCH = "callbacks.nonfinite_loss.action"


class NonFiniteLossError(RuntimeError):
    """A training step's loss, one of its logged loss terms, or a gradient was NaN or infinite."""


def _world_any(flag: bool, device: torch.device) -> bool:
    """``flag`` or-ed over the processes of the default group (itself on one process)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def _value(v: Any) -> float:
    return float(v.detach().float().mean()) if isinstance(v, torch.Tensor) else float(v)


def _guard(step: Callable) -> Callable:
    @functools.wraps(step)
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self._finite_logs is not None:   # a subclass's step calling its parent's: the outermost one checks
            return step(self, *args, **kwargs)
        self._finite_logs = []
        try:
            out = step(self, *args, **kwargs)
        finally:
            held, self._finite_logs = self._finite_logs, None
        return self._checked_step(out, held)

    training_step._finite_guard = True  # type: ignore[attr-defined]
    return training_step


class FiniteGuard:
    """The checks of the module docstring, mixed into :class:`~seqaware.modules.base.SeqawareModule`: every
    ``training_step`` a subclass defines is wrapped (so a new module is checked without a line of its own), and
    :meth:`log` holds the step's logs until :meth:`_checked_step` lets them through."""

    nonfinite_action: str = "stop"
    nonfinite_skips: int = 0
    _finite_logs: Optional[list] = None
    _last_finite: Optional[dict[str, tuple[int, torch.Tensor]]] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("training_step")
        if step is not None and not getattr(step, "_finite_guard", False):
            cls.training_step = _guard(step)

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:  # LightningModule.log
        if self._finite_logs is not None:
            self._finite_logs.append((name, value, args, kwargs))
            return
        super().log(name, value, *args, **kwargs)  # type: ignore[misc]

    def _checked_step(self, out: Any, held: list) -> Any:
        loss = out.get("loss") if isinstance(out, Mapping) else out
        terms: dict[str, Any] = {}
        if isinstance(loss, torch.Tensor):
            terms["the returned loss"] = loss
        for name, value, _, _ in held:
            if "loss" in name and isinstance(value, (torch.Tensor, float, int)):
                terms[name] = value
        bad = False
        if terms:
            tensors = [v.detach().float().reshape(-1) if isinstance(v, torch.Tensor) else
                       torch.tensor([float(v)]) for v in terms.values()]
            device = tensors[0].device
            finite = torch.cat([t.to(device) for t in tensors]).isfinite().all()
            bad = _world_any(not bool(finite), device)
        if not bad:
            last = self._last_finite if self._last_finite is not None else {}
            for name, value in terms.items():
                last[name] = (int(self.global_step), value.detach() if isinstance(value, torch.Tensor) else value)
            self._last_finite = last
            for name, value, args, kwargs in held:
                super().log(name, value, *args, **kwargs)  # type: ignore[misc]
            self._log_skips()
            return out
        message = self._nonfinite_message(terms)
        self._nonfinite(message)
        return None

    def _nonfinite_message(self, terms: Mapping[str, Any]) -> str:
        parts = []
        for name, value in terms.items():
            if bool(torch.as_tensor(value).detach().isfinite().all()):
                continue
            v = _value(value)
            seen = (self._last_finite or {}).get(name)
            before = (f"last finite value {_value(seen[1]):.6g} at step {seen[0]}" if seen is not None
                      else "no finite value before")
            parts.append(f"{name} = {v} ({before})")
        if not parts:
            parts.append("a loss term on another process")
        return f"step {int(self.global_step)}: non-finite training loss: " + "; ".join(parts)

    def finite_fit_loss(self, loss: torch.Tensor, where: str, step: int) -> bool:
        """A training loop the module runs itself (the closure head's cross-validation fits, in ``setup``): True
        when ``loss`` is finite; otherwise stop naming ``where`` and the step, or (skip) count it and return False,
        and the caller leaves that step's update out."""
        if bool(loss.detach().isfinite().all()):
            return True
        self._nonfinite(f"{where}, step {step}: non-finite training loss {_value(loss)}", log=False)
        return False

    def _nonfinite(self, message: str, log: bool = True) -> None:
        """Stop (raise) or count a skip, as ``nonfinite_action`` says (``log``: log the count, in a training step)."""
        if self.nonfinite_action not in ACTIONS:
            raise ValueError(f"{SWITCH} must be one of {list(ACTIONS)}, got {self.nonfinite_action!r}")
        if self.nonfinite_action == "stop":
            raise NonFiniteLossError(f"{message}. The run stops before this step changes any weight; nothing is "
                                     f"exported and no test runs ({SWITCH}=skip skips such steps instead)")
        self.nonfinite_skips += 1
        logger.warning("%s: step skipped (%d so far; %s=skip)", message, self.nonfinite_skips, SWITCH)
        if log:
            self._log_skips()

    def _log_skips(self) -> None:
        if self.nonfinite_action == "skip":
            super().log(SKIPS_KEY, float(self.nonfinite_skips), on_step=True, on_epoch=False)  # type: ignore[misc]

    def check_gradients(self) -> bool:
        """After the backward pass: True when every gradient is finite (or the check does not apply); otherwise
        stop, or drop every gradient (the optimizer then skips every parameter) and return False."""
        trainer = getattr(self, "_trainer", None)
        scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
        if scaler is not None:   # 16-mixed: the gradient scaler skips inf steps and lowers its scale
            return True
        named = [(n, p) for n, p in self.named_parameters() if p.grad is not None]  # type: ignore[attr-defined]
        if not named:
            return True
        norms = torch._foreach_norm([p.grad for _, p in named])
        device = named[0][1].grad.device
        finite = torch.stack([n.float().to(device) for n in norms]).isfinite().all()
        if not _world_any(not bool(finite), device):
            return True
        broken = [n for (n, _), v in zip(named, norms) if not bool(v.isfinite())]
        shown = ", ".join(broken[:3]) + (f" and {len(broken) - 3} more" if len(broken) > 3 else "")
        message = (f"step {int(self.global_step)}: non-finite gradient of {shown or 'a parameter on another process'} "
                   "after a finite loss")
        if self.nonfinite_action == "skip":
            for _, p in named:
                p.grad = None
        self._nonfinite(message)
        return False

    def _finite_state(self, checkpoint: dict) -> None:
        if self.nonfinite_skips:
            checkpoint["nonfinite_skips"] = int(self.nonfinite_skips)

    def _load_finite_state(self, checkpoint: dict) -> None:
        self.nonfinite_skips = int(checkpoint.get("nonfinite_skips", 0))
