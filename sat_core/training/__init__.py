"""Training: the trainer (``trainer``), the paper's objective (``losses``), objectives beyond it plugged in as
extra loss terms (``supervision``), what is refused before any work (``checks``) and the resumable state
(``state``). ``python -m sat_core.train`` is the command."""
