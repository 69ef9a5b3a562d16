"""``RequeueSlurmLauncher``: hydra-submitit-launcher's ``SlurmLauncher`` that requeues a run the project
stopped on the time-limit signal.

Before the time limit SLURM sends SIGUSR1. Two handlers want it, and Python keeps one per signal:
submitit's (installed when the job starts: resubmit the same job, ``scontrol requeue``, exit) and the
project's (``seqaware.callbacks.Preemption``, installed for the duration of ``fit``: finish the batch,
save a resumable checkpoint, restore the previous handler, exit with 128 + the signal). The project's
wins during ``fit``, so submitit never hears of the signal and the job would end unrequeued.

This launcher closes the gap: when the job's task exits with ``128 + <submitit's signal>``, the
checkpoint is on disk and submitit's handler is back in place, so it raises that signal again in this
process. Submitit then requeues the job exactly as if the signal had just arrived (counting it against
``max_num_timeout``); the requeued job runs in the same run folder and resumes from the checkpoint.
Any other exit passes through unchanged.
"""
import signal
from typing import Any, Optional

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher


def requeue_signal(exit_code: Any) -> Optional[int]:
    """Submitit's preemption signal if ``exit_code`` says the run stopped on it (128 + signal), else None."""
    from submitit.core.job_environment import JobEnvironment

    signum = int(JobEnvironment._usr_sig())
    return signum if exit_code == 128 + signum else None


class RequeueSlurmLauncher(SlurmLauncher):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except SystemExit as stop:
            signum = requeue_signal(stop.code)
            if signum is not None:
                signal.raise_signal(signum)  # submitit's handler: checkpoint the submission, requeue, exit
            raise
