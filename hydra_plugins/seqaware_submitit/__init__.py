"""SLURM launcher of ``hydra/launcher=slurm``: hydra-submitit-launcher's, plus the hand-over from the
project's checkpoint-and-exit on SIGUSR1 to submitit's requeue (see requeue_launcher.py, docs/cluster.md)."""
