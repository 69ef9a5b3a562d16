"""Cluster launch and hyper-parameter search: the SLURM launcher config, the SLURM environment
plugin, the Optuna sweeper (resumable study), a local submitit sweep and -m with DDP (one sweep folder)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _run(cmd: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=ENV)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-5000:])
    return res


# ---------------------------------------------------------------- SLURM launcher config
@pytest.mark.slow
def test_slurm_launcher_composes_with_overrides(tmp_path):
    """`--cfg all` of train.py: the SLURM launcher with its overrides, nothing is launched."""
    res = _run([sys.executable, str(ROOT / "train.py"), "hydra/launcher=slurm", "hydra.launcher.partition=gpu",
                "hydra.launcher.nodes=2", "hydra.launcher.gpus_per_node=4", "hydra.launcher.timeout_min=1440",
                "hydra.launcher.signal_delay_s=240", "hydra.launcher.max_num_timeout=5", "trainer.num_nodes=2",
                "trainer=ddp", "trainer.devices=4", "--cfg", "all", "--resolve"], cwd=ROOT)
    cfg = yaml.safe_load(res.stdout)
    launcher = cfg["hydra"]["launcher"]
    assert (cfg["trainer"]["num_nodes"], cfg["trainer"]["devices"], cfg["trainer"]["strategy"]) == (2, 4, "ddp")
    assert launcher["_target_"] == "hydra_plugins.seqaware_submitit.requeue_launcher.RequeueSlurmLauncher"
    assert (launcher["partition"], launcher["nodes"], launcher["gpus_per_node"]) == ("gpu", 2, 4)
    assert launcher["tasks_per_node"] == 4, "one SLURM task per GPU"
    assert launcher["timeout_min"] == 1440 and launcher["max_num_timeout"] == 5
    assert launcher["additional_parameters"]["signal"] == "USR1@240"
    assert "export SUBMITIT_PREEMPT_SIGNAL=USR1" in launcher["setup"]
    assert "Submitit" not in res.stdout + res.stderr


def _hydra_cli(argv: list[str], monkeypatch, capsys) -> str:
    """What ``python train.py ARGV`` prints for Hydra's --cfg / --help, through Hydra's own code
    (hydra._internal.utils.run_and_report's path), in this process: the import of train.py's
    libraries would make a subprocess cost seconds."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path, get_args_parser
    from hydra.core.global_hydra import GlobalHydra

    import seqaware.config  # noqa: F401  (resolvers)

    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    parser = get_args_parser()
    args = parser.parse_args(argv)
    GlobalHydra.instance().clear()
    try:
        app = Hydra.create_main_hydra2(task_name="train", config_search_path=create_config_search_path(str(ROOT / "configs")))
        if args.help:
            app.app_help(config_name="train.yaml", args_parser=parser, args=args)
        else:
            app.show_cfg(config_name="train.yaml", overrides=args.overrides, cfg_type=args.cfg, package=args.package,
                         resolve=args.resolve)
    finally:
        GlobalHydra.instance().clear()
    return capsys.readouterr().out


def test_documented_cfg_hydra_resolve_check_works_and_creates_nothing(monkeypatch, capsys):
    """docs/cluster.md: check a SLURM composition without submitting anything (`--cfg hydra --resolve`)."""
    doc = (ROOT / "docs" / "cluster.md").read_text()
    command = re.search(r"`python train\.py (hydra/launcher=slurm [^`]*--cfg hydra --resolve)`", doc).group(1).split()
    args = [a for a in command if a != "..."]
    args.insert(1, "hydra.launcher.partition=gpu")  # the "..." of the docs
    logs_before = sorted((ROOT / "logs").rglob("*")) if (ROOT / "logs").exists() else []
    cfg = yaml.safe_load(_hydra_cli(args, monkeypatch, capsys))
    launcher = cfg["hydra"]["launcher"]
    assert launcher["partition"] == "gpu" and launcher["additional_parameters"]["signal"] == "USR1@300"
    assert "/runs/" in cfg["hydra"]["run"]["dir"] and "/multiruns/" in cfg["hydra"]["sweep"]["dir"]
    logs_after = sorted((ROOT / "logs").rglob("*")) if (ROOT / "logs").exists() else []
    assert logs_after == logs_before, "printing the config reserved a run folder"


def test_help_lists_the_groups_a_user_picks_and_the_launchers(monkeypatch, capsys):
    out = _hydra_cli(["--help"], monkeypatch, capsys)
    groups = dict(line.split(": ", 1) for line in out.split("== Config ==")[0].splitlines() if ": " in line
                  and not line.startswith(" "))
    assert groups["hydra/launcher"] == "basic, local, slurm"
    assert "seqaware_optuna" in groups["hydra/sweeper"]
    for internal in ("experiment_base", "model/common", "eval", "prompts", "source"):
        assert internal not in groups, f"{internal} is not a group a user picks"
    assert "base" not in groups["data"].split(", ") and "default" not in groups["trainer"].split(", ")
    assert groups["encoder"] == "clipvil, image, text, visualbert, visualbert_detector"
    experiments = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))
    assert groups["experiment"] == ", ".join(experiments)
    assert "task_name: train" in out.split("== Config ==")[1]


def test_slurm_sbatch_script_has_the_signal_and_requeue(tmp_path):
    """The sbatch script submitit writes from our launcher values: USR1 before the limit, one task per GPU."""
    from submitit.slurm.slurm import _make_sbatch_string

    launcher = {"nodes": 2, "gpus_per_node": 4, "tasks_per_node": 4, "signal_delay_s": 300,
                "additional_parameters": {"signal": "USR1@300"}, "setup": ["export SUBMITIT_PREEMPT_SIGNAL=USR1"]}
    script = _make_sbatch_string(command="python -m submitit.core._submit X", folder=tmp_path, job_name="j",
                                 partition="gpu", time=60, nodes=launcher["nodes"], gpus_per_node=launcher["gpus_per_node"],
                                 ntasks_per_node=launcher["tasks_per_node"], signal_delay_s=launcher["signal_delay_s"],
                                 additional_parameters=launcher["additional_parameters"], setup=launcher["setup"])
    assert "#SBATCH --signal=USR1@300" in script and "USR2" not in script
    assert "#SBATCH --ntasks-per-node=4" in script and "#SBATCH --nodes=2" in script
    assert script.index("export SUBMITIT_PREEMPT_SIGNAL=USR1") < script.index("srun")


@pytest.mark.slow
def test_slurm_environment_only_under_slurm(monkeypatch, compose_train):
    """trainer.plugins.slurm: Lightning's SLURMEnvironment with auto_requeue off inside SLURM, absent outside."""
    from lightning_fabric.plugins.environments import SLURMEnvironment

    import train
    from seqaware.launch import slurm_environment

    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    assert slurm_environment() is None
    for key, value in {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "seqaware", "SLURM_JOB_ID": "123",
                       "SLURM_NODELIST": "node1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}.items():
        monkeypatch.setenv(key, value)
    cfg = compose_train("experiment=order_baseline", "trainer.max_epochs=1")
    env = train.build(cfg)[2]._accelerator_connector.cluster_environment
    assert isinstance(env, SLURMEnvironment) and env.auto_requeue is False
    cfg = compose_train("experiment=order_baseline", "trainer.plugins.slurm.auto_requeue=true")
    assert [p.auto_requeue for p in train._instantiate_group(cfg.trainer.plugins)] == [True]


# ---------------------------------------------------------------- Optuna sweeper
OBJECTIVE = """
import hydra


@hydra.main(version_base="1.3", config_path=".", config_name="objective")
def main(cfg):
    if cfg.fail:
        raise RuntimeError("this trial fails")
    return (cfg.x - 2.0) ** 2 + cfg.y
    

if __name__ == "__main__":
    main()
"""

OBJECTIVE_YAML = """
defaults:
  - override hydra/sweeper: seqaware_optuna
  - _self_
x: 0.0
y: 0
fail: false
hydra:
  mode: MULTIRUN
  sweep:
    dir: SWEEP
  sweeper:
    direction: minimize
    study_name: tiny
    n_trials: 3
    sampler:
      _target_: optuna.samplers.TPESampler
      seed: 0
      n_startup_trials: 2
    params:
      x: interval(-5, 5)
      y: choice(0, 1)
"""


@pytest.fixture
def objective_app(tmp_path):
    sweep = tmp_path / "sweep"
    (tmp_path / "app.py").write_text(OBJECTIVE)
    (tmp_path / "objective.yaml").write_text(OBJECTIVE_YAML.replace("SWEEP", str(sweep)))
    return tmp_path, sweep


def _study(sweep: Path):
    import optuna

    return optuna.load_study(study_name="tiny", storage=f"sqlite:///{sweep / 'optuna.db'}")


@pytest.mark.slow
def test_optuna_sweeper_runs_and_resumes_the_study(objective_app):
    from optuna.trial import TrialState

    app, sweep = objective_app
    _run([sys.executable, "app.py"], cwd=app)
    study = _study(sweep)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    for t in study.trials:  # the value Optuna holds is what the job returned for its parameters
        assert t.value == pytest.approx((t.params["x"] - 2.0) ** 2 + t.params["y"])
        assert -5 <= t.params["x"] <= 5 and t.params["y"] in (0, 1)
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1", "2"]
    first = [(t.number, t.params) for t in study.trials]
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(study.best_value)

    # the same command again: the study is complete, nothing runs
    _run([sys.executable, "app.py"], cwd=app)
    assert len(_study(sweep).trials) == 3
    # more trials: the study is loaded and grows; the earlier trials are kept as they were
    # (random sampling only: the same seed must not replay the first run's draws)
    _run([sys.executable, "app.py", "hydra.sweeper.n_trials=5", "hydra.sweeper.sampler.n_startup_trials=10"], cwd=app)
    study = _study(sweep)
    assert len(study.trials) == 5 and all(t.state == TrialState.COMPLETE for t in study.trials)
    assert [(t.number, t.params) for t in study.trials[:3]] == first
    assert not {t.params["x"] for t in study.trials[3:]} & {params["x"] for _, params in first}
    assert (sweep / "4").is_dir()


@pytest.mark.slow
def test_optuna_sweeper_reruns_interrupted_trials_and_records_failures(objective_app):
    import optuna
    from optuna.trial import TrialState

    app, sweep = objective_app
    sweep.mkdir()
    study = optuna.create_study(study_name="tiny", storage=f"sqlite:///{sweep / 'optuna.db'}", direction="minimize")
    study.enqueue_trial({"x": 1.5, "y": 1})
    space = {"x": optuna.distributions.FloatDistribution(-5, 5), "y": optuna.distributions.CategoricalDistribution([0, 1])}
    assert study.ask(space).params == {"x": 1.5, "y": 1}  # a trial a killed search left RUNNING
    _run([sys.executable, "app.py", "hydra.sweeper.n_trials=2"], cwd=app)
    trials = _study(sweep).trials
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["interrupted"]
    assert trials[1].params == {"x": 1.5, "y": 1} and trials[1].value == pytest.approx(1.25)
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 2
    # a job that raises is told FAIL, counts as finished, and the search goes on
    _run([sys.executable, "app.py", "hydra.sweeper.n_trials=3", "fail=true"], cwd=app)
    trials = _study(sweep).trials
    assert len(trials) == 4 and trials[-1].state == TrialState.FAIL and "interrupted" not in trials[-1].user_attrs
    # a searched key missing from the config stops the search and leaves no RUNNING trial behind
    res = subprocess.run([sys.executable, "app.py", "hydra.sweeper.n_trials=4", "z=choice(1, 2)"], capture_output=True,
                         text=True, timeout=300, cwd=app, env=ENV)
    assert res.returncode != 0 and "Key 'z' is not in struct" in res.stderr
    trials = _study(sweep).trials
    assert len(trials) == 5 and trials[-1].state == TrialState.FAIL and trials[-1].user_attrs == {"config_error": True}


@pytest.mark.parametrize("line, kind, expected", [
    ("a=choice(1, 2, 4)", "CategoricalDistribution", {"choices": (1, 2, 4)}),
    ("a=range(1, 5)", "IntDistribution", {"low": 1, "high": 4, "step": 1, "log": False}),
    ("a=interval(0.1, 0.5)", "FloatDistribution", {"low": 0.1, "high": 0.5, "log": False}),
    ("a=tag(log, interval(1e-5, 1e-2))", "FloatDistribution", {"low": 1e-5, "high": 1e-2, "log": True}),
    ("a=3", None, None),
])
def test_search_space_from_override_grammar(line, kind, expected):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hydra_plugins.seqaware_optuna_sweeper.optuna_sweeper import distribution

    dist = distribution(OverridesParser.create().parse_override(line))
    if kind is None:
        assert dist is None
        return
    assert type(dist).__name__ == kind
    for key, value in expected.items():
        assert getattr(dist, key) == value


def test_optuna_search_preset_composes(tmp_path):
    """hparams_search=optuna_tpe selects our sweeper; every searched key exists in the job config."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    import seqaware.config  # noqa: F401

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            cfg = compose("train.yaml", overrides=["experiment=order_baseline", "hparams_search=optuna_tpe",
                                                   f"hydra.sweep.dir={tmp_path}"], return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_ == "hydra_plugins.seqaware_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    assert sweeper.storage == f"sqlite:///{tmp_path}/optuna.db" and sweeper.study_name == "order_baseline"
    assert cfg.optimized_metric == "val/pmr" and sweeper.direction == "maximize"
    for key in sweeper.params:
        assert OmegaConf.select(cfg, key) is not None, f"searched key {key} is not in the config"


# ---------------------------------------------------------------- sweeps of train.py
def _tiny_train_args(cache_dir: Path, logs: Path) -> list[str]:
    from conftest import TINY_SYNTHETIC

    return ["experiment=order_baseline", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
            "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "data.batch_size=4",
            "data.collator.image_size=32", f"paths.cache_dir={cache_dir}", f"paths.log_dir={logs}",
            "callbacks.progress_bar.refresh_rate=0", *[f"data.source.{k}={v}" for k, v in TINY_SYNTHETIC.items()]]


@pytest.mark.slow
def test_local_submitit_sweep_two_runs(tmp_path, tiny_synthetic_dir, cache_dir):
    """hydra/launcher=local: 2 jobs, each in its own process, in one sweep folder with two run folders."""
    logs = tmp_path / "logs"
    _run([sys.executable, "train.py", "-m", "hydra/launcher=local", "seed=1,2", "optimized_metric=val/pmr",
          *_tiny_train_args(cache_dir, logs)], cwd=ROOT, timeout=600)  # from the checkout, as users run it
    sweeps = list((logs / "order_baseline" / "multiruns").iterdir())
    assert len(sweeps) == 1, sweeps
    assert not (logs / "order_baseline" / "runs").exists()
    jobs = sorted(p.name for p in sweeps[0].iterdir() if p.is_dir() and not p.name.startswith("."))
    assert jobs == ["0", "1"]
    for job, seed in zip(jobs, (1, 2)):
        assert (sweeps[0] / job / "predictions_test.jsonl").is_file()
        assert yaml.safe_load((sweeps[0] / job / ".hydra" / "config.yaml").read_text())["seed"] == seed
    # submitit ran them: its job folders (one per job) hold the pickled results
    assert len(list(sweeps[0].glob(".submitit/*/*_result.pkl"))) == 2


@pytest.mark.slow
def test_multirun_with_ddp_runs_every_job_as_it_runs_alone(tmp_path, tiny_synthetic_dir, cache_dir):
    """-m with trainer=ddp (2 CPU processes, gloo), two jobs: rank 1 runs each job in the job's folder
    (seqaware.launch.pin_ddp_relaunch: one sweep folder, no stray run folder), the second job launches
    its own rank 1 (seqaware.launch.ddp_sweep_job), and its test metrics equal the same job run alone."""
    import json

    logs = tmp_path / "logs"
    ddp = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", *_tiny_train_args(cache_dir, logs)]
    res = _run([sys.executable, str(ROOT / "train.py"), "-m", "seed=1,2", *ddp], cwd=tmp_path, timeout=600)
    task = logs / "order_baseline"
    assert sorted(p.name for p in task.iterdir()) == ["multiruns"], list(task.rglob("*"))[:20]
    sweeps = list((task / "multiruns").iterdir())
    assert len(sweeps) == 1, sweeps
    assert sorted(p.name for p in sweeps[0].iterdir() if p.is_dir()) == ["0", "1"]
    assert (res.stderr + res.stdout).count("GLOBAL_RANK: 1, MEMBER: 2/2") == 2
    for job in ("0", "1"):
        folder = sweeps[0] / job
        assert (folder / "train_ddp_process_1.log").is_file(), f"rank 1 did not run job {job} in its folder"
        assert json.loads((folder / "run.json").read_text())["status"] == "finished"
        assert len((folder / "predictions_test.jsonl").read_text().splitlines()) == 8

    _run([sys.executable, str(ROOT / "train.py"), "seed=2", "run_name=alone", *ddp], cwd=tmp_path, timeout=600)
    alone = json.loads((task / "runs" / "alone" / "test_metrics.json").read_text())
    assert json.loads((sweeps[0] / "1" / "test_metrics.json").read_text()) == alone


@pytest.mark.parametrize("launcher, pinned", [("basic", True), ("local", False)])
def test_pin_ddp_relaunch_points_at_the_job(tmp_path, monkeypatch, launcher, pinned):
    """Fast check of what Lightning's re-launch will see: this job's overrides, RUN mode, its folder."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import open_dict

    from seqaware.launch import pin_ddp_relaunch

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            cfg = compose("train.yaml", overrides=["seed=3", "trainer=ddp", f"hydra/launcher={launcher}"],
                          return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.runtime.output_dir = str(tmp_path / "sweep" / "0")
        cfg.hydra.overrides.task = ["seed=3", "trainer=ddp"]
    monkeypatch.setattr(HydraConfig.instance(), "cfg", HydraConfig.instance().cfg)  # restored afterwards
    HydraConfig.instance().set_config(cfg)
    monkeypatch.setattr(sys, "argv", ["train.py", "-m", "seed=3,4", "trainer=ddp"])
    assert pin_ddp_relaunch() is pinned
    if pinned:
        assert sys.argv == ["train.py", "seed=3", "trainer=ddp", "hydra.mode=RUN"]
        assert HydraConfig.get().run.dir == str(tmp_path / "sweep" / "0")
    else:
        assert sys.argv == ["train.py", "-m", "seed=3,4", "trainer=ddp"]


def test_ddp_sweep_job_releases_the_ranks_and_resets_lightnings_state(tmp_path, monkeypatch):
    """The end of a pinned sweep job: Lightning's watchdog is detached before the job's rank is killed
    (else it would SIGKILL the process that runs the sweep), the rank's exit code is reported, and
    LOCAL_RANK / WORLD_SIZE / MASTER_PORT are back to what they were, so the next job launches its ranks."""
    import time

    from lightning_fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    import seqaware.launch as launch

    sweep_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # stands for rank 0
    rank1 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    watchdog = _ChildProcessObserver(main_pid=sweep_process.pid, child_processes=[rank1], sleep_period=0.05)
    watchdog.start()
    monkeypatch.setattr(launch, "pin_ddp_relaunch", lambda: True)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    try:
        with pytest.raises(ValueError, match="the job failed"):
            with launch.ddp_sweep_job(rank_timeout_s=30) as pinned:
                assert pinned
                os.environ.update(LOCAL_RANK="0", WORLD_SIZE="2", MASTER_PORT="12345", MASTER_ADDR="10.0.0.1")
                raise ValueError("the job failed")
        assert rank1.poll() == -9, "the failed job's rank was not killed"
        time.sleep(0.3)  # several watchdog polls
        assert not watchdog.is_alive() and sweep_process.poll() is None, "the watchdog killed the sweep"
        assert "LOCAL_RANK" not in os.environ and "MASTER_PORT" not in os.environ and "WORLD_SIZE" not in os.environ
        assert os.environ["MASTER_ADDR"] == "127.0.0.1"
    finally:
        for proc in (sweep_process, rank1):
            proc.kill()
            proc.wait()


def test_a_rank_that_failed_fails_the_sweep_job(monkeypatch):
    from lightning_fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    import seqaware.launch as launch

    rank1 = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    rank1.wait()
    watchdog = _ChildProcessObserver(main_pid=os.getpid(), child_processes=[rank1], sleep_period=3600)
    watchdog.start()  # sleeps; released before it looks
    monkeypatch.setattr(launch, "pin_ddp_relaunch", lambda: True)
    with pytest.raises(RuntimeError, match=r"\{1: 3\}; see their logs \(train_ddp_process_<rank>\.log\) in the run folder$"):
        with launch.ddp_sweep_job():
            pass


def test_a_failed_rank_points_at_the_jobs_own_folder(monkeypatch, tmp_path):
    """Inside a Hydra job the error names that job's output folder, where the ranks' logs are."""
    from types import SimpleNamespace

    from hydra.core.hydra_config import HydraConfig
    from lightning_fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    import seqaware.launch as launch

    rank1 = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
    rank1.wait()
    _ChildProcessObserver(main_pid=os.getpid(), child_processes=[rank1], sleep_period=3600).start()
    monkeypatch.setattr(launch, "pin_ddp_relaunch", lambda: True)
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: SimpleNamespace(runtime=SimpleNamespace(output_dir=tmp_path / "job3"))))
    with pytest.raises(RuntimeError, match=r"\{1: 2\}; see their logs .* in " + re.escape(str(tmp_path / "job3")) + "$"):
        with launch.ddp_sweep_job():
            pass


@pytest.mark.parametrize("exit_code, requeued", [(128 + 10, True), (128 + 15, False), (1, False), (None, False)])
def test_slurm_launcher_hands_a_checkpointed_stop_to_submitit(monkeypatch, exit_code, requeued):
    """A job that exits with 128 + SIGUSR1 (checkpoint saved) re-raises SIGUSR1 for submitit's
    requeue handler; any other exit passes through."""
    import signal

    from hydra_plugins.seqaware_submitit.requeue_launcher import RequeueSlurmLauncher

    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    monkeypatch.setattr("submitit.core.job_environment.JobEnvironment.USR_SIG", "USR1")
    assert int(signal.SIGUSR1) == 10

    def job(self, *args, **kwargs):
        raise SystemExit(exit_code)

    # the parent class itself (Hydra's plugin scan may have loaded a second copy of its module)
    monkeypatch.setattr(RequeueSlurmLauncher.__mro__[1], "__call__", job)
    heard = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: heard.append(signum))
    try:
        with pytest.raises(SystemExit) as stop:
            RequeueSlurmLauncher()([], "hydra.sweep.dir", 0, "id", {})
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert stop.value.code == exit_code
    assert heard == ([signal.SIGUSR1] if requeued else [])


def test_split_overrides_separates_script_arguments_from_hydra_overrides():
    from seqaware.launch import split_overrides

    assert split_overrides(["--seeds", "1", "2", "--", "trainer.max_steps=3", "seed=1"]) == (
        ["--seeds", "1", "2"], ["trainer.max_steps=3", "seed=1"])
    assert split_overrides(["--steps", "10"]) == (["--steps", "10"], [])
    assert split_overrides(["--"]) == ([], [])
