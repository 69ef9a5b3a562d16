"""A small Hydra sweeper over current Optuna (``hydra/sweeper=seqaware_optuna``).

Why not ``hydra-optuna-sweeper``: its last release (1.2.0 / 1.3.0.dev) pins optuna 2.10, whose sqlite
storage fails under SQLAlchemy 2, and its sampler configs do not instantiate with hydra-core 1.3.8.

Behaviour:

* ``params`` use Hydra's override grammar: ``choice(a, b)`` -> categorical, ``range(1, 5)`` -> int
  (step 1 unless given), ``interval(a, b)`` -> float, ``tag(log, interval(a, b))`` -> log-uniform
  (``tag(log, range(a, b))`` -> log int); a plain value is passed to every trial unchanged.
  Sweep overrides given on the command line are added to ``params``.
* the study lives in ``storage`` (default: sqlite in the sweep folder) under ``study_name`` and is
  loaded if it exists, so rerunning the same command with the same ``hydra.sweep.dir`` continues the
  search: only the missing trials run. Trials left RUNNING by a killed search are marked FAIL
  and their parameters are enqueued again. A resumed study's sampler is reseeded (its seed would
  replay the first run's random draws), so a resumed search is not bit-reproducible.
* ``n_trials`` is the number of finished trials the study should hold (complete or failed in the
  job; not trials whose config did not compose, which stop the search); ``n_jobs`` trials are asked at once and launched as one batch (parallel with submitit).
* a trial's value is the task function's return value (``train.py`` returns ``optimized_metric``);
  a job that raises or returns no number is told to Optuna as FAIL and the search goes on.
* each trial's job number is its Optuna trial number, so its run folder is ``<sweep dir>/<number>``.
"""

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

INTERRUPTED = "interrupted"   # user attribute of trials a killed search left RUNNING


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.seqaware_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    # minimize | maximize (the task function's return value)
    direction: str = "maximize"
    study_name: str = "${hydra.job.name}"
    # an Optuna storage URL; relative sqlite paths resolve against the working directory
    storage: Optional[str] = "sqlite:///${hydra.sweep.dir}/optuna.db"
    # finished trials the study should hold (a resumed search runs only the missing ones)
    n_trials: int = 20
    # trials launched at once (in parallel with the submitit launchers)
    n_jobs: int = 1
    sampler: Dict[str, Any] = field(default_factory=lambda: {
        "_target_": "optuna.samplers.TPESampler", "seed": 42, "n_startup_trials": 10})
    params: Optional[Dict[str, str]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="seqaware_optuna", node=OptunaSweeperConf,
                             provider="seqaware")


def distribution(override: Override) -> Any:
    """The Optuna distribution of a sweep override, or None for a plain value."""
    import optuna.distributions as D

    if not override.is_sweep_override():
        return None
    value = override.value()
    log_scale = "log" in getattr(value, "tags", set())
    if override.is_choice_sweep():
        assert isinstance(value, ChoiceSweep)
        if log_scale:
            raise ValueError(f"{override.get_key_element()}: tag(log, ...) needs interval() or range(), not choice()")
        return D.CategoricalDistribution([v for v in value.list])
    if override.is_range_sweep():
        assert isinstance(value, RangeSweep)
        start, stop, step = value.start, value.stop, value.step
        if all(isinstance(v, int) for v in (start, stop, step)):
            # Hydra's range() excludes stop, Optuna's int bounds are inclusive
            return D.IntDistribution(int(start), int(stop) - 1, log=log_scale, step=1 if log_scale else int(step))
        return D.FloatDistribution(float(start), float(stop), log=log_scale, step=None if log_scale else float(step))
    if override.is_interval_sweep():
        assert isinstance(value, IntervalSweep)
        return D.FloatDistribution(float(value.start), float(value.end), log=log_scale)
    raise ValueError(f"{override.get_key_element()}: unsupported sweep {override.input_line!r}")


class OptunaSweeper(Sweeper):
    def __init__(self, direction: str, study_name: str, storage: Optional[str], n_trials: int, n_jobs: int,
                 sampler: Any, params: Optional[Dict[str, str]] = None) -> None:
        if direction not in ("minimize", "maximize"):
            raise ValueError(f"hydra.sweeper.direction must be minimize or maximize, got {direction!r}")
        if n_trials < 1 or n_jobs < 1:
            raise ValueError(f"hydra.sweeper.n_trials and n_jobs must be >= 1, got {n_trials} and {n_jobs}")
        self.direction, self.study_name, self.storage = direction, study_name, storage
        self.n_trials, self.n_jobs = int(n_trials), int(n_jobs)
        self.sampler_cfg = sampler
        self.params = dict(params or {})
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.launcher = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def _space(self, arguments: List[str]) -> tuple[dict[str, Any], list[str]]:
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        lines = [f"{k}={v}" for k, v in self.params.items()] + list(arguments)
        space: dict[str, Any] = {}
        fixed: dict[str, str] = {}
        for override in parser.parse_overrides(lines):
            key = override.get_key_element()
            dist = distribution(override)
            if dist is None:
                fixed[key] = f"{key}={override.get_value_element_as_str()}"
                space.pop(key, None)
            else:
                space[key] = dist
                fixed.pop(key, None)
        return space, list(fixed.values())

    def _storage_url(self) -> Optional[str]:
        assert self.config is not None
        if not self.storage:
            return None
        prefix = "sqlite:///"
        if self.storage.startswith(prefix):
            path = Path(self.storage[len(prefix):]).absolute()
            path.parent.mkdir(parents=True, exist_ok=True)
            return prefix + str(path)
        return self.storage

    def load_study(self) -> Any:
        import optuna

        sampler = self.sampler_cfg  # Hydra instantiates the sweeper recursively: usually a sampler already
        if isinstance(sampler, (dict, DictConfig)):
            sampler = instantiate(sampler) if sampler else None
        study = optuna.create_study(study_name=self.study_name, storage=self._storage_url(), sampler=sampler,
                                    direction=self.direction, load_if_exists=True)
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            log.warning("trial %d was left running by an interrupted search: marked FAIL, its parameters enqueued again",
                        trial.number)
            study._storage.set_trial_user_attr(trial._trial_id, INTERRUPTED, True)
            study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
            study.enqueue_trial(trial.params, skip_if_exists=False)
        if study.trials:
            # the sampler's seed would replay the first run's random draws (duplicate trials)
            log.info("resuming study %r (%d trials): sampler reseeded", self.study_name, len(study.trials))
            study.sampler.reseed_rng()
        return study

    @staticmethod
    def finished(study: Any) -> int:
        """Trials that count towards ``n_trials``: complete, pruned, or failed inside their job."""
        from optuna.trial import TrialState

        return sum(1 for t in study.get_trials(deepcopy=False)
                   if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                   or (t.state == TrialState.FAIL and not t.user_attrs.get(INTERRUPTED)
                       and not t.user_attrs.get("config_error")))

    def sweep(self, arguments: List[str]) -> Any:
        from optuna.trial import TrialState

        assert self.config is not None and self.launcher is not None
        space, fixed = self._space(arguments)
        if not space:
            raise ValueError("hydra.sweeper.params holds no search space (choice/range/interval)")
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        study = self.load_study()
        done = self.finished(study)
        if done:
            log.info("study %r already holds %d finished trial(s) of %d", self.study_name, done, self.n_trials)
        returns = []
        while done < self.n_trials:
            trials = [study.ask(space) for _ in range(min(self.n_jobs, self.n_trials - done))]
            batch = [fixed + [f"{key}={trial.params[key]}" for key in space] for trial in trials]
            try:
                self.validate_batch_is_legal(batch)
            except Exception:  # a config that does not compose: leave no RUNNING trial behind
                for trial in trials:
                    trial.set_user_attr("config_error", True)
                    study.tell(trial, state=TrialState.FAIL)
                raise
            # job number == trial number: launch each run of consecutive trial numbers as one batch
            results: list = []
            start = 0
            for end in range(1, len(trials) + 1):
                if end == len(trials) or trials[end].number != trials[end - 1].number + 1:
                    results += list(self.launcher.launch(batch[start:end], initial_job_idx=trials[start].number))
                    start = end
            for trial, ret in zip(trials, results):
                value = ret._return_value if ret.status == JobStatus.COMPLETED else None
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    study.tell(trial, float(value))
                else:
                    reason = ret._return_value if ret.status == JobStatus.FAILED else f"returned {value!r}"
                    log.error("trial %d failed (%s): told FAIL", trial.number, reason)
                    study.tell(trial, state=TrialState.FAIL)
            returns.append(results)
            done = self.finished(study)
        if any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
            best = study.best_trial
            summary = {"name": "optuna", "study_name": self.study_name, "direction": self.direction,
                       "best_value": best.value, "best_trial": best.number, "best_params": best.params,
                       "n_trials": len(study.trials)}
            OmegaConf.save(OmegaConf.create(summary), sweep_dir / "optimization_results.yaml")
            log.info("best trial %d: %s = %s", best.number, best.params, best.value)
        return returns
