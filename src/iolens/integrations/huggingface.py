"""A Hugging Face ``TrainerCallback``: record the run, time the data wait, log the verdict.

    from iolens.integrations.huggingface import IolensCallback
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[IolensCallback(out="runs/today")])

What is timed: the Trainer fetches the batches of an optimizer step (all
``gradient_accumulation_steps`` of them) before ``on_step_begin``, and
logs, evaluates and saves after ``on_step_end``. A step runs from one
``on_step_begin`` to the next; its data wait from the last of
``on_step_end``, ``on_log``, ``on_evaluate`` and ``on_save`` (or the
epoch's start) to its ``on_step_begin``. With gradient accumulation a
step is an optimizer step: it spans several batches, and its data wait is
the fetch of all of them.

When the DataLoader patch of ``iolens run`` or of the monitor started here
already times the training loader (a torch DataLoader, as the Trainer
builds), the recording keeps the patch's per-batch figures and this
callback writes no records of its own, so no batch is counted twice. Its
own timing then only feeds the data-wait share it logs as training goes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from iolens.integrations._common import Outcome, Session, emit, num_workers

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as exc:
    raise ImportError(
        "iolens.integrations.huggingface needs Hugging Face transformers: "
        "pip install 'iolens[huggingface]'") from exc

__all__ = ["IolensCallback"]


class IolensCallback(TrainerCallback):
    """Record the training run with ``iolens.monitor()`` and log what holds it back.

    ``out``, ``interval``, ``paths``, ``devices`` and ``quiet`` are
    :func:`iolens.monitor`'s. At each of the Trainer's logging steps
    (``logging_steps``) the data-wait share and steps per second since the
    last one join its logs as ``iolens/data_wait_share`` and
    ``iolens/steps_per_s``: the console and ``state.log_history`` show
    them, and so do the callbacks after this one (those that ``report_to``
    adds come before it and do not). When training ends the run's figures
    (the same keys, ``iolens/severity_level``: 0 none, 1 moderate, 2 high,
    ``iolens/batches``) and the verdict in words (``iolens/verdict``,
    ``iolens/run_dir``) are appended to ``state.log_history``, and the
    verdict lines go to the ``iolens.integrations`` Python logger.
    :attr:`outcome` keeps all of it.

    Only the world process zero records; under ``iolens run`` the monitor
    records nothing of its own and the verdict logged is the one over the
    records so far.
    """

    def __init__(self, out: str | os.PathLike[str] | None = None, interval: float = 1.0,
                 paths: Sequence[str | os.PathLike[str]] = (), devices: Sequence[str] = (), *,
                 quiet: bool = False, mlflow: bool = False, wandb: bool = False) -> None:
        super().__init__()
        self._session = Session(out, interval, paths, devices, quiet=quiet,
                                hooks="Trainer step", mlflow=mlflow,
                                wandb=wandb)
        self.outcome: Outcome | None = None
        """What was logged when training last ended."""

    @property
    def run_dir(self) -> str | None:
        """Where the run is recorded (set when training starts on process zero)."""
        return self._session.run_dir

    # -- lifetime ------------------------------------------------------------------------

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        self._session.start(main=_is_zero(state))
        self._session.arm(kwargs.get("train_dataloader"))

    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        loader = kwargs.get("train_dataloader")
        self._session.arm(loader)
        self._session.timer.epoch(num_workers(loader))

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        outcome = self._session.finish()
        if not _is_zero(state):
            return
        self.outcome = outcome
        try:
            if outcome.metrics or outcome.text:
                entry: dict[str, Any] = {**outcome.metrics, **outcome.text,
                                         "step": state.global_step}
                state.log_history.append(entry)
        except Exception:  # noqa: BLE001 - see NOTE [never hurt the job] in _common
            pass
        emit(outcome.lines)

    # -- per step: clock reads only ------------------------------------------------------

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:
        self._session.timer.begin()

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        self._session.timer.end()

    def on_evaluate(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        self._session.timer.end()  # evaluation is not data wait of the next step

    def on_save(self, args: TrainingArguments, state: TrainerState,
                control: TrainerControl, **kwargs: Any) -> None:
        self._session.timer.end()  # nor is a checkpoint

    def on_log(self, args: TrainingArguments, state: TrainerState,
               control: TrainerControl, **kwargs: Any) -> None:
        self._session.timer.end()  # nor is logging
        logs = kwargs.get("logs")
        if not isinstance(logs, dict) or not _is_zero(state):
            return
        figures = self._session.recent()
        if not figures:
            return
        logs.update(figures)
        try:
            last = state.log_history[-1] if state.log_history else None
            if isinstance(last, dict) and last.get("step") == state.global_step:
                last.update(figures)  # the Trainer keeps a copy of these logs there
        except Exception:  # noqa: BLE001 - see NOTE [never hurt the job] in _common
            pass


def _is_zero(state: Any) -> bool:
    try:
        return bool(state.is_world_process_zero)
    except Exception:  # noqa: BLE001 - see NOTE [never hurt the job] in _common
        return False
