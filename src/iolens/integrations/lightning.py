"""A PyTorch Lightning callback: record the run, time the data wait, log the verdict.

    from iolens.integrations.lightning import IolensCallback
    trainer = Trainer(callbacks=[IolensCallback(out="runs/today")])

Uses ``lightning.pytorch``, or the older ``pytorch_lightning`` package when
that is the one installed.

What is timed: Lightning fetches a batch (and moves it to the device)
before ``on_train_batch_start``. A step runs from one
``on_train_batch_start`` to the next; its data wait from the previous
``on_train_batch_end`` (or the end of validation, or the epoch's start) to
its ``on_train_batch_start``: the fetch, the transfer to the device and
what Lightning and later callbacks do after a batch (metric logging, a
checkpoint written from ``on_train_batch_end``).

When the DataLoader patch of ``iolens run`` or of the monitor started here
already times the training loader (a torch DataLoader), the recording keeps
the patch's figures, which time the fetch alone, and this callback writes
no batch records of its own, so no batch is counted twice. Its own timing
then only feeds the data-wait share it logs as training goes. A loader the
patch cannot see (any other iterable) is recorded from these hooks.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from iolens.integrations._common import Outcome, Session, emit, log, num_workers
from iolens.training import _hooks

try:
    import lightning.pytorch as pl
except ImportError:  # the package's older name
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    except ImportError as exc:
        raise ImportError(
            "iolens.integrations.lightning needs PyTorch Lightning (the lightning or "
            "pytorch_lightning package): pip install 'iolens[lightning]'") from exc

__all__ = ["IolensCallback"]


class IolensCallback(pl.Callback):
    """Record the training run with ``iolens.monitor()`` and log what holds it back.

    ``out``, ``interval``, ``paths``, ``devices`` and ``quiet`` are
    :func:`iolens.monitor`'s. Every ``log_every_n_steps`` training batches
    (default: the trainer's ``log_every_n_steps``) the data-wait share and
    steps per second since the last time go to the trainer's loggers as
    ``iolens/data_wait_share`` and ``iolens/steps_per_s``. When training ends
    the run's figures follow (the same two keys, then ``iolens/severity_level``,
    0 none, 1 moderate, 2 high, and ``iolens/batches``), the class and
    severity as hyperparameters (``iolens/verdict``, ``iolens/severity``,
    ``iolens/run_dir``), and the verdict lines to the ``iolens.integrations``
    Python logger. :attr:`outcome` keeps all of it.

    Only the global rank zero records; under ``iolens run`` the monitor
    records nothing of its own and the verdict logged is the one over the
    records so far.
    """

    def __init__(self, out: str | os.PathLike[str] | None = None, interval: float = 1.0,
                 paths: Sequence[str | os.PathLike[str]] = (), devices: Sequence[str] = (), *,
                 quiet: bool = False, log_every_n_steps: int | None = None,
                 mlflow: bool = False, wandb: bool = False) -> None:
        super().__init__()
        if log_every_n_steps is not None and log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps must be 1 or more, not {log_every_n_steps!r}")
        self.log_every_n_steps = log_every_n_steps
        self._session = Session(out, interval, paths, devices, quiet=quiet,
                                hooks="Lightning batch", mlflow=mlflow,
                                wandb=wandb)
        self._every = 50
        self._count = 0
        self.outcome: Outcome | None = None
        """What was logged when training last ended."""

    @property
    def run_dir(self) -> str | None:
        """Where the run is recorded (set when fitting starts on rank zero)."""
        return self._session.run_dir

    # -- lifetime ------------------------------------------------------------------------

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Before the fit loop asks for its first batch, so the recording has them all.
        every = self.log_every_n_steps or getattr(trainer, "log_every_n_steps", None)
        self._every = every if isinstance(every, int) and every > 0 else 50
        self._count = 0
        self._session.start(main=_is_global_zero(trainer))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._session.arm(_train_loader(trainer))
        with contextlib.suppress(Exception):  # NOTE [never hurt the job]
            _note_mlflow_logger(trainer)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loader = _train_loader(trainer)
        self._session.arm(loader)
        self._session.timer.epoch(num_workers(loader))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        outcome = self._session.finish()
        if not _is_global_zero(trainer):
            return
        self.outcome = outcome
        _log(trainer, outcome.metrics, outcome.text)
        emit(outcome.lines)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self.outcome = self._session.finish()  # the recording ends with the failure

    # -- per batch: clock reads only -----------------------------------------------------

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        self._session.timer.begin()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        self._session.timer.end()
        self._count += 1
        if self._count >= self._every:
            self._count = 0
            if _is_global_zero(trainer):
                _log(trainer, self._session.recent(), None)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._session.timer.end()  # validation is not data wait of the next training batch


def _note_mlflow_logger(trainer: Any) -> None:
    """An MLFlowLogger's run is the job's MLflow run (NOTE [the job's tracker run] in
    iolens/training/_hooks.py): it logs through MLflow's client, not the active run."""
    w = _hooks.writer()
    if w is None:
        return
    for logger in getattr(trainer, "loggers", None) or ():
        if type(logger).__name__ == "MLFlowLogger" and getattr(logger, "run_id", None):
            w.note_mlflow_run(str(logger.run_id), str(logger.experiment_id),
                              str(getattr(logger, "_tracking_uri", None) or ""))
            return


def _is_global_zero(trainer: Any) -> bool:
    try:
        return bool(trainer.is_global_zero)
    except Exception:  # noqa: BLE001 - see NOTE [never hurt the job] in _common
        return False


def _train_loader(trainer: Any) -> Any:
    """The training loader(s) the trainer holds (a loader, or a list or dict of them)."""
    try:
        loader = trainer.train_dataloader
    except Exception:  # noqa: BLE001 - see NOTE [never hurt the job] in _common
        return None
    if isinstance(loader, Mapping):
        return dict(loader)
    return loader


_warned: set[str] = set()


def _log(trainer: Any, metrics: Mapping[str, float], text: Mapping[str, str] | None) -> None:
    """Hand figures to every logger of the trainer; a logger that fails is told of once."""
    if not metrics and not text:
        return
    try:
        loggers = list(trainer.loggers)
        step = int(trainer.global_step)
    except Exception:  # noqa: BLE001 - see NOTE [never hurt the job] in _common
        return
    for lg in loggers:
        try:
            if metrics:
                lg.log_metrics(dict(metrics), step=step)
            if text:
                lg.log_hyperparams(dict(text))
        except Exception as exc:  # noqa: BLE001 - see NOTE [never hurt the job] in _common
            name = type(lg).__name__
            if name not in _warned:
                _warned.add(name)
                log.warning("iolens: %s did not take the figures (%r)", name, exc)
