"""Hydra sweeper plugin ``hydra/sweeper=seqaware_optuna``: Optuna search with a resumable sqlite study.

Lives in the ``hydra_plugins`` namespace package because Hydra only instantiates sweepers found
there. See :mod:`hydra_plugins.seqaware_optuna_sweeper.optuna_sweeper` and docs/cluster.md.
"""
