"""Callbacks that watch a training run from inside a framework's own loop.

    from iolens.integrations.lightning import IolensCallback      # PyTorch Lightning
    trainer = lightning.pytorch.Trainer(callbacks=[IolensCallback(out="runs/today")])

    from iolens.integrations.huggingface import IolensCallback    # Hugging Face Trainer
    trainer = transformers.Trainer(..., callbacks=[IolensCallback(out="runs/today")])

Each starts ``iolens.monitor()`` when training starts (on the main process
only), times the data wait between the framework's step hooks, logs the
data-wait share to the framework's loggers as training goes, and the verdict
and key figures when it ends. This package imports neither framework: only
the submodule of the framework in use does, and it names the extra to
install when that framework is missing.
"""
