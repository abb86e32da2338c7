"""Training-side timing: how long the loop waits for each batch.

Runs inside the training process, so everything here is cheap and lazy:
nothing imports torch until the user's script does.
"""
