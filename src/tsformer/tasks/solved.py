"""Tasks whose weights are solved in closed form at the fit's start (`model=linear`,
`model=random_kernel_ridge`): one epoch, no optimiser step."""

from __future__ import annotations

import warnings


class SolvedAtFitStart:
    """Mixin (before the LightningModule in the bases): `solve()` at the fit's start, one epoch whose
    `training_step` returns None on purpose (Lightning's warning that it did is silenced for this fit
    only), then stop."""

    _none_on_purpose = None

    def solve(self) -> None:
        raise NotImplementedError

    def on_fit_start(self) -> None:
        self.solve()
        self._none_on_purpose = warnings.catch_warnings()
        self._none_on_purpose.__enter__()
        warnings.filterwarnings("ignore", message=r"`training_step` returned `None`")

    def on_fit_end(self) -> None:
        self._restore_warnings()

    def on_exception(self, exception: BaseException) -> None:
        self._restore_warnings()

    def _restore_warnings(self) -> None:
        if self._none_on_purpose is not None:
            self._none_on_purpose.__exit__(None, None, None)
            self._none_on_purpose = None

    def on_train_epoch_end(self) -> None:
        self.trainer.should_stop = True  # one epoch: the weights are final before it
