"""Training-side timing: how long the loop waits for each batch.

Runs inside the job's processes (the training process and its DataLoader workers), so
everything here is cheap and lazy:
nothing imports torch until the user's script does.
"""
