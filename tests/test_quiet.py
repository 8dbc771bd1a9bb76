"""The library messages a run leaves out (`tsformer.quiet`) are exactly those named: the same logger's
other lines, and any warning or error, still show."""

from __future__ import annotations

import logging
import warnings

from tsformer.quiet import CHATTER, quiet_library_chatter

LIGHTNING = "lightning.pytorch.utilities.rank_zero"


def test_named_chatter_is_dropped_and_nothing_else(caplog):
    quiet_library_chatter()
    quiet_library_chatter()  # once is enough; twice changes nothing
    logger = logging.getLogger(LIGHTNING)
    assert len(logger.filters) == len({type(f) for f in logger.filters})
    with caplog.at_level(logging.INFO, logger=LIGHTNING):
        logger.info("💡 Tip: For seamless cloud logging, try installing litlogger")
        logger.info("`Trainer(limit_test_batches=1.0)` was configured so 100% of the batches will be used..")
        logger.info("`Trainer(limit_train_batches=3)` was configured so 3 batches per epoch will be used.")
        logger.info("GPU available: False, used: False")
        logger.warning("💡 Tip: a warning that looks like a tip")
    shown = [r.getMessage() for r in caplog.records]
    assert shown == [
        "`Trainer(limit_train_batches=3)` was configured so 3 batches per epoch will be used.",  # a user's
        "GPU available: False, used: False",
        "💡 Tip: a warning that looks like a tip",
    ]
    assert set(CHATTER) == {LIGHTNING, "mlflow.pyfunc"}


def test_the_named_library_warning_is_silenced_and_others_are_not():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning shown, then the named one silenced
        quiet_library_chatter()
        warnings.warn(
            "`isinstance(treespec, LeafSpec)` is deprecated, use ...", DeprecationWarning, stacklevel=1
        )
        warnings.warn("a deprecation of tsformer's own", DeprecationWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["a deprecation of tsformer's own"]
