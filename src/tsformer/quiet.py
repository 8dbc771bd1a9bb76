"""Library messages a user cannot act on, kept out of a run's output (`quiet_library_chatter`, called by
`train.run`). Each is named exactly, by its logger and the start of its text, or by a warning's text;
only informational records are dropped, so that no warning or error of a library, and no other message,
is ever hidden.
"""

from __future__ import annotations

import logging
import re
import warnings

# logger -> the informational lines dropped (regular expressions matched at the start of the message)
CHATTER = {
    "lightning.pytorch.utilities.rank_zero": (
        r"💡 Tip: ",  # advertisements for Lightning's cloud products
        # the config's own limits, which train.yaml sets to 1.0 on purpose (every test window evaluated)
        r"`Trainer\(limit_(train|val|test|predict)_batches=1\.0\)` was configured so 100% of the batches",
        r"Loading `train_dataloader` to estimate number of stepping batches\.$",
        # the run's own model table (`callbacks.ModelTable`) in place of Lightning's
        r"Trainer already configured with model summary callbacks: \[<class 'tsformer\.callbacks\.ModelTable'>\]",
    ),
    # MLflow checks the logged model's input example by answering it: tsformer already did (train.run)
    "mlflow.pyfunc": (r"Validating input example against model signature$",),
}
# warnings of a library about its own code, which a user of tsformer cannot change
LIBRARY_WARNINGS = (r"`isinstance\(treespec, LeafSpec\)` is deprecated",)  # Lightning's use of torch


class DropChatter(logging.Filter):
    """Drops the informational records of one logger whose message starts with one of `patterns`."""

    def __init__(self, patterns: tuple[str, ...]):
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        message = record.getMessage()
        return not any(p.match(message) for p in self.patterns)


def quiet_library_chatter() -> None:
    """Install the filters (once per process: calling it again changes nothing)."""
    for name, patterns in CHATTER.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropChatter) for f in logger.filters):
            logger.addFilter(DropChatter(patterns))
    for message in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
