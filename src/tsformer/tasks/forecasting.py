"""Forecasting tasks: N history steps -> M future steps, with known future covariates.

- `EncoderDecoderForecaster` (`enc_dec`): the encoder reads the history (targets and all
  covariates); the decoder is teacher-forced in training and generates the M steps at evaluation.
- `DecoderOnlyForecaster` (`dec_only`): one token per step (or per patch) over history + future;
  teacher-forced over the whole window in training, generated step by step (patch by patch) after
  the history at evaluation.
  Past-only (observed) covariates are predicted and fed back like targets (unknown in the future).
- `EncoderForecaster` (`enc_only_forecast`): the encoder-only model whose outputs are mapped to M
  steps by one linear layer; the documents' point of comparison for the encoder-decoder. So that
  the comparison is about the architecture, not about information, it sees what the others see:
  the N history steps and, when there are known covariates, M more tokens carrying the known
  covariates of the future steps (their target and observed channels zero, and a flag channel 1).

- `LinearForecaster` (`linear`): the closed-form channel-shared ridge (`models/linear.py`), no
  Transformer: fitted when the fit starts (train windows, the penalty chosen on validation windows);
  the fit loop then runs one epoch that moves no weight (its train/loss and validation are logged as
  any model's) and stops. Every forecasting run measures the same model as its `linear` baseline.

Evaluation always predicts the future without looking at it: only `hist_*` and `fut_known` enter
`predict_target`.

Model options (each family's `supported_options`; README "Model options"): RevIN and channel
independence wrap all three families the same way, outside them (`model_options.py`); patch tokens
(`nn/patching.py`) are cut from the encoder-only forecaster's token sequence (history [+ future
known steps]) and from the encoder-decoder's history (its decoder keeps one token per future step);
the decoder-only family takes patches side by side over its whole window and generates a patch per
token (`model.patch_stride` null or equal to `model.patch_len`; context and horizon whole patches).
The closed-form linear path (`model.linear_path`) is declared once for the three Transformer
families (`_TransformerForecaster`).

Output heads (`nn/heads.py`): every family's network gives the head's `n_params` outputs per
channel. The autoregressive families (`enc_dec`, `dec_only`) feed back the head's point value in a
deterministic rollout (`predict_target`, used for validation) and a random draw in sampled
trajectories (`sample_paths`, `model.head.num_samples` paths per window as one batch through the
KV-cached decoder); the encoder-only forecaster gives the marginal distribution of every future
step at once (`predict_params`).
"""

from __future__ import annotations

import torch

from tsformer.models import (
    ChannelSharedLinear,
    DecoderOnly,
    DecoderOnlyConfig,
    EncoderDecoder,
    EncoderDecoderConfig,
    EncoderOnly,
    EncoderOnlyConfig,
    LinearConfig,
)
from tsformer.models.linear import PENALTIES
from tsformer.nn.channel_mixing import ChannelMixing
from tsformer.tasks.base import FORECASTS, WindowTask, valid_steps
from tsformer.tasks.baselines import LinearForecast, SolvedLinear, window_batches
from tsformer.tasks.linear_gate import GATES, GateSums, fit_gate
from tsformer.tasks.solved import SolvedAtFitStart


def history(batch: dict) -> torch.Tensor:
    """Everything observed in the history window, `(B, N, Dy + Dk + Do)`."""
    return torch.cat([batch["hist_target"], batch["hist_known"], batch["hist_observed"]], dim=-1)


class _Forecaster(WindowTask):
    produces = FORECASTS

    def build_net(self, net: dict) -> torch.nn.Module:
        return self.build_forecaster(net)

    def build_forecaster(self, net: dict) -> torch.nn.Module:
        raise NotImplementedError

    def job_baselines(self) -> list:
        """Persistence (`test/baseline_*`) and the closed-form linear forecaster (`test/linear_*`)."""
        return [self.naive_baseline(), LinearForecast()]

    def keep_solved_linear(self, model, val_mse: dict, dm) -> None:
        """`model` (a `ChannelSharedLinear`) as just solved on `dm`'s train windows, its penalty chosen on
        its validation windows (`val_mse`): the run's `linear` baseline takes it where it is the same fit
        (`SolvedLinear`) rather than solving the same equations again at the test's start."""
        solved = SolvedLinear.of(model, val_mse, dm.datasets["train"], dm.datasets["val"])
        for baseline in self.baselines:
            if isinstance(baseline, LinearForecast):
                baseline.solved = solved


class _TransformerForecaster(_Forecaster):
    """The settings every Transformer forecasting family shares, declared once.

    `linear_path`: the forecast is the closed-form linear forecaster's (`models/linear.py`, solved on
    the train windows when the fit starts, penalty chosen on the validation windows) plus the
    Transformer's. The linear forecast is made in the data's units and enters the network's view as a
    target does (`fut_linear`: RevIN-normalised, split by channel); each family adds it to its
    network's outputs of the future steps (`_plus_linear_path`; the autoregressive families before a
    step's value is fed back, `generate(offset=...)`), so while the network's output layer, which
    starts at zero, adds nothing, the forecast is exactly the linear forecast: training starts from it,
    the Transformer learns what it misses, the linear weights train too (`linear_path_frozen`: they
    stay as solved). Point head only.

    `linear_gate` (global | step | channel; none: off): after training, the share of the forecast's
    departure from the closed-form linear forecaster (the run's `linear` baseline: the solved weights,
    kept apart as `linear_reference` however the linear path trained) is chosen on the validation
    windows (`tasks/linear_gate.py`), and saved with the weights (`linear_gate_share`); a share of 0
    gives exactly the linear forecaster's forecast. It weighs the finished forecast (an autoregressive
    family's generated one), so it takes any family, on the linear path or not. Point head only."""

    def __init__(
        self,
        *args,
        linear_path: bool = False,
        linear_path_frozen: bool = False,
        linear_gate: str = "none",
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.linear_path = None
        hp = self.hparams
        if linear_path:
            self.require_point_head("model.linear_path")
            self.linear_path = ChannelSharedLinear(LinearConfig(hp.context_len, hp.horizon, hp.d_known))
            # solved first, then trained with the rest (or kept as solved: linear_path_frozen)
            self.linear_path.weight.requires_grad_(not linear_path_frozen)
            torch.nn.init.zeros_(self.net.head.weight)  # the Transformer's share starts at zero
            torch.nn.init.zeros_(self.net.head.bias)
        self.linear_reference = None
        self.gate_report: dict[str, float] = {}
        # after a gate's fit in this process: each form's share (and the model's own, 1), scored on the
        # test windows beside the configured one (test/gate_<form>_mse), to choose a form on validation
        self.form_shares: dict[str, torch.Tensor] = {}
        self._form_errors: dict[str, list[float]] = {}
        self._ungated: tuple[torch.Tensor, torch.Tensor] | None = None
        if linear_gate not in GATES:
            raise ValueError(f"model.linear_gate: {linear_gate!r} is not one of {', '.join(GATES)}")
        if linear_gate != "none":
            self.require_point_head("model.linear_gate")
            self.linear_reference = ChannelSharedLinear(LinearConfig(hp.context_len, hp.horizon, hp.d_known))
            # 1: the model as trained, until the validation windows choose (`fit_linear_gate`)
            self.register_buffer("linear_gate_share", torch.ones(hp.horizon, hp.d_target))  # (M, Dy)
            self.register_buffer("linear_gate_fitted", torch.tensor(False))

    def on_fit_start(self) -> None:
        dm = self.trainer.datamodule
        solve_now = self.solve_linear_path(dm)
        if self.linear_reference is not None and self.trainer.ckpt_path is None:  # not resumed
            # this run's own linear forecaster (weights from a model folder are not), chosen again after the fit
            self.linear_gate_fitted.fill_(False)
            if solve_now:  # solved just now: its solved weights, before any training
                self.linear_reference.load_state_dict(self.linear_path.state_dict())
            else:
                val_mse = self.linear_reference.fit(
                    window_batches(dm.datasets["train"]), window_batches(dm.datasets["val"])
                )
                self.keep_solved_linear(self.linear_reference, val_mse, dm)

    @property
    def gated(self) -> bool:
        """Whether forecasts are gated: a gate configured and chosen on validation windows."""
        return self.linear_reference is not None and bool(self.linear_gate_fitted)

    @torch.no_grad()
    def fit_linear_gate(self, dm) -> dict[str, float]:
        """Choose the gate's share on `dm`'s validation windows with the weights as they are now (the
        test's: the best checkpoint); returns its figures (`gate/*`), also kept in `gate_report`."""
        val = dm.datasets["val"]
        sums = GateSums(len(val), self.hparams.horizon, self.hparams.d_target)
        self.linear_gate_fitted.fill_(False)
        for batch in window_batches(val):
            batch = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}
            linear = self.linear_reference(batch["hist_target"], batch["fut_known"])  # (B, M, Dy)
            sums.add(batch["fut_target"], linear, self.forecast(batch), valid_steps(batch, "fut"))
        form = self.hparams.linear_gate
        share, self.gate_report = fit_gate(sums, form)
        self.form_shares = {"ungated": torch.ones_like(share)}
        for other in GATES[1:]:  # what the other forms would give, for choosing a form on validation
            other_share, figures = (share, self.gate_report) if other == form else fit_gate(sums, other)
            self.gate_report[f"gate/val_mse_{other}"] = figures["gate/val_mse_gated"]
            self.form_shares[other] = other_share
        self.linear_gate_share.copy_(share)
        self.linear_gate_fitted.fill_(True)
        return self.gate_report

    def on_test_start(self) -> None:
        if self.linear_reference is not None and not self.gated:  # chosen once (a model folder keeps it)
            self.fit_linear_gate(self.trainer.datamodule)
        super().on_test_start()

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._ungated = None
        super().test_step(batch, batch_idx)
        if self._ungated is None or not self.form_shares:
            return
        out, linear = self._ungated  # (B, M, Dy), kept by `forecast`
        true, valid = self.true_target(batch), self.target_valid(batch)
        for form, share in self.form_shares.items():
            error = (linear + share.to(out) * (out - linear) - true)[valid]  # (n valid steps, Dy)
            sums = self._form_errors.setdefault(form, [0.0, 0])
            sums[0] += float(error.double().square().sum())
            sums[1] += error.numel()
        self._ungated = None

    def on_test_epoch_end(self) -> None:
        figures = dict(self.gate_report)
        figures |= {f"test/gate_{form}_mse": sse / max(n, 1) for form, (sse, n) in self._form_errors.items()}
        self._form_errors = {}
        if figures:
            self.log_dict(figures)
        super().on_test_epoch_end()

    def solve_linear_path(self, dm) -> bool:
        """Solve the linear path unless it is solved (resumed, or started from a model folder: kept);
        whether it was solved now."""
        solve_now = self.linear_path is not None and bool(self.linear_path.penalty.isnan())
        if solve_now:
            self.fit_linear_path(dm)
        return solve_now

    def fit_linear_path(self, dm) -> None:
        """Solve the linear path on `dm`'s train windows (penalty chosen on its validation windows)."""
        val_mse = self.linear_path.fit(
            window_batches(dm.datasets["train"]), window_batches(dm.datasets["val"])
        )
        self.keep_solved_linear(self.linear_path, val_mse, dm)

    def with_linear_path(self, batch: dict) -> dict:
        """A batch as it comes from the data (static features appended) with its linear forecast."""
        if self.linear_path is None:
            return batch
        linear = self.linear_path(batch["hist_target"], batch["fut_known"])  # (B, M, Dy)
        return batch | {"fut_linear": linear}

    def _plus_linear_path(self, out: torch.Tensor, batch: dict) -> torch.Tensor:
        """The network's output of the future steps plus the linear forecast in the network's view."""
        return out + batch["fut_linear"] if "fut_linear" in batch else out  # (B', M, Dy')

    def forecast(self, batch: dict) -> torch.Tensor:
        out = super().forecast(self.with_linear_path(batch))  # (B, M, Dy), on the linear path if any
        if not self.gated:
            return out
        linear = self.linear_reference(batch["hist_target"], batch["fut_known"])  # (B, M, Dy)
        if self.form_shares and not self.training:  # the test scores the other forms too (test_step)
            self._ungated = (out, linear)
        return linear + self.linear_gate_share.to(out.dtype) * (out - linear)

    def training_loss(self, batch: dict) -> torch.Tensor:
        return super().training_loss(self.with_linear_path(batch))


class EncoderDecoderForecaster(_TransformerForecaster):
    family = "enc_dec"
    autoregressive = True
    supported_options = frozenset({"revin", "channel_independent", "patch_len"})

    def build_forecaster(self, net: dict) -> EncoderDecoder:
        hp = self.hparams
        return EncoderDecoder(
            EncoderDecoderConfig(
                **net,
                **self.patch_args,
                d_enc_in=self.d_target_net + self.d_known_in + hp.d_observed,
                d_target=self.d_target_net,
                d_known=self.d_known_in,
                n_params=self.head.n_params,
            )
        )

    def teacher_forced(self, batch: dict):
        out = self.net(history(batch), batch["hist_target"][:, -1], batch["fut_target"], batch["fut_known"])
        return self._plus_linear_path(out, batch), batch["fut_target"], valid_steps(batch, "fut")

    def predict_target(self, batch: dict) -> torch.Tensor:
        draw = self.head.point_of_raw
        return self.net.generate(
            history(batch),
            batch["hist_target"][:, -1],
            batch["fut_known"],
            draw=draw,
            offset=batch.get("fut_linear"),  # added to each step's output before it is fed back
        )  # (B, M, Dy)

    def sample_paths(self, batch: dict, num_samples: int) -> torch.Tensor:
        paths = self.net.generate(
            history(batch),
            batch["hist_target"][:, -1],
            batch["fut_known"],
            draw=self.head.sample_of_raw,
            num_samples=num_samples,
        )  # (B * S, M, Dy)
        return paths.unflatten(0, (-1, num_samples))  # (B, S, M, Dy)


class DecoderOnlyForecaster(_TransformerForecaster):
    family = "dec_only"
    autoregressive = True
    supported_options = frozenset({"revin", "channel_independent", "patch_len"})

    def build_forecaster(self, net: dict) -> DecoderOnly:
        hp = self.hparams
        if hp.patch_len is not None:  # the window is cut into patches side by side: both parts whole
            if hp.patch_stride not in (None, hp.patch_len):
                raise ValueError(
                    f"model.patch_stride={hp.patch_stride}: the decoder-only family generates patches side by "
                    f"side, so model.patch_stride must be null or equal model.patch_len ({hp.patch_len})"
                )
            for name, n in (("model.context_len", hp.context_len), ("model.horizon", hp.horizon)):
                if n % hp.patch_len:
                    raise ValueError(
                        f"{name}={n} is not a whole number of patches of model.patch_len={hp.patch_len}: "
                        f"the decoder-only family generates a patch per token"
                    )
        return DecoderOnly(
            DecoderOnlyConfig(
                **net,
                **self.patch_args,
                d_target=self.d_target_net + hp.d_observed,
                d_known=self.d_known_in,
                n_params=self.head.n_params,
            )
        )

    def teacher_forced(self, batch: dict):
        # autoregressive channels: targets, then observed covariates (predicted and fed back too)
        auto = torch.cat(
            [
                torch.cat([batch["hist_target"], batch["hist_observed"]], dim=-1),
                torch.cat([batch["fut_target"], batch["fut_observed"]], dim=-1),
            ],
            dim=1,
        )  # (B, N + M, Dy + Do)
        known = torch.cat([batch["hist_known"], batch["fut_known"]], dim=1)  # (B, N + M, Dk)
        prev, known_next, labels = self.net.teacher_forcing(auto, known)
        P = self.net.patch  # labels start one patch (P = 1: one step) into the window
        valid = torch.cat([valid_steps(batch, "hist"), valid_steps(batch, "fut")], dim=1)[
            :, P:
        ]  # (B, N + M - P), as labels
        out = self.net(prev, known_next)  # (B, N + M - P, Dy + Do): its last M steps are the future's
        if "fut_linear" in batch:
            M = batch["fut_target"].shape[1]
            out = torch.cat([out[:, :-M], out[:, -M:] + self._auto_offset(batch)], dim=1)
        return out, labels, valid

    def _auto_offset(self, batch: dict) -> torch.Tensor | None:
        """The linear forecast on the autoregressive channels: `(B, M, Dy + Do)`, 0 on the past-only
        covariates (None without the linear path)."""
        if "fut_linear" not in batch:
            return None
        return torch.nn.functional.pad(batch["fut_linear"], (0, self.hparams.d_observed))

    def predict_target(self, batch: dict) -> torch.Tensor:
        hist_auto = torch.cat([batch["hist_target"], batch["hist_observed"]], dim=-1)  # (B, N, Dy + Do)
        pred = self.net.generate(
            hist_auto,
            batch["hist_known"],
            batch["fut_known"],
            draw=self.head.point_of_raw,
            offset=self._auto_offset(batch),  # added to each patch's output before it is fed back
        )
        return pred[..., : self.d_target_net]  # (B, M, Dy + Do) -> (B, M, Dy)

    def sample_paths(self, batch: dict, num_samples: int) -> torch.Tensor:
        # the past-only covariates are sampled and fed back too (a path is a joint draw), then dropped
        hist_auto = torch.cat([batch["hist_target"], batch["hist_observed"]], dim=-1)  # (B, N, Dy + Do)
        paths = self.net.generate(
            hist_auto,
            batch["hist_known"],
            batch["fut_known"],
            draw=self.head.sample_of_raw,
            num_samples=num_samples,
        )  # (B * S, M, Dy + Do)
        return paths[..., : self.d_target_net].unflatten(0, (-1, num_samples))  # (B, S, M, Dy)


class EncoderForecaster(_TransformerForecaster):
    """`linear_path`, `linear_gate`: see `_TransformerForecaster`.

    `channel_mixing`: a path across the target channels (`nn/channel_mixing.py`, iTransformer-like)
    whose correction is added to the linear forecast the Transformer starts from; it starts at zero
    and trains with the rest (the gate weighs the whole departure from the linear forecaster)."""

    family = "enc_only_forecast"
    supported_options = frozenset({"revin", "channel_independent", "patch_len"})
    teacher_forced_is_forecast = True  # one pass of the network, no teacher forcing

    def __init__(self, *args, channel_mixing: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.channel_mixing = None
        if channel_mixing:
            self.require_point_head("model.channel_mixing")
            self.channel_mixing = ChannelMixing(self.hparams.context_len, self.hparams.horizon)

    def with_linear_path(self, batch: dict) -> dict:
        """A batch as it comes from the data (static features appended) with its linear forecast, plus
        the cross-channel path's correction (`channel_mixing`): what the Transformer adds to."""
        parts = []
        if self.linear_path is not None:
            parts.append(self.linear_path(batch["hist_target"], batch["fut_known"]))  # (B, M, Dy)
        if self.channel_mixing is not None:
            parts.append(self.channel_mixing(batch["hist_target"]))  # (B, M, Dy)
        return batch | {"fut_linear": sum(parts[1:], parts[0])} if parts else batch

    def build_forecaster(self, net: dict) -> EncoderOnly:
        hp = self.hparams
        n_steps = hp.context_len + (hp.horizon if self.d_known_in > 0 else 0)  # steps of `tokens`
        return EncoderOnly(
            EncoderOnlyConfig(
                **net,
                **self.patch_args,  # with patches, the n_steps are cut into patch tokens
                d_in=self.d_target_net + self.d_known_in + hp.d_observed + 1,  # + the "future step" flag
                d_out=self.d_target_net,
                head="forecast",
                context_len=n_steps,
                horizon=hp.horizon,
                n_params=self.head.n_params,
            )
        )

    def tokens(self, batch: dict) -> torch.Tensor:
        """History steps, then (with known covariates) the future steps' known covariates:
        `(B, N [+ M], Dy + Dk + Do + 1)`; the last channel flags future steps."""
        hist = history(batch)
        B, N, _ = hist.shape
        hist = torch.cat([hist, hist.new_zeros(B, N, 1)], dim=-1)  # (B, N, D + 1)
        if self.d_known_in == 0:
            return hist
        fut_known = batch["fut_known"]  # (B, M, Dk)
        M = fut_known.shape[1]
        Dy, Do = self.d_target_net, self.hparams.d_observed
        fut = torch.cat(
            [
                fut_known.new_zeros(B, M, Dy),
                fut_known,
                fut_known.new_zeros(B, M, Do),
                fut_known.new_ones(B, M, 1),
            ],
            dim=-1,
        )  # (B, M, D + 1): targets and observed covariates unknown in the future
        return torch.cat([hist, fut], dim=1)  # (B, N + M, D + 1)

    def teacher_forced(self, batch: dict):  # nothing to force: the forecast itself
        out = self._plus_linear_path(self.net(self.tokens(batch)), batch)
        return out, batch["fut_target"], valid_steps(batch, "fut")

    def predict_target(self, batch: dict) -> torch.Tensor:
        return self.head.point_of_raw(
            self._plus_linear_path(self.net(self.tokens(batch)), batch)
        )  # (B, M, Dy)

    def predict_params(self, batch: dict) -> torch.Tensor:
        return self.head.params(self.net(self.tokens(batch)))  # (B, M, Dy, P)


class LinearForecaster(SolvedAtFitStart, _Forecaster):
    """`model=linear`: the closed-form linear forecaster as a model family (`models/linear.py`).

    `subtract`: each window's reference (last | mean); `penalties`: the relative ridge penalties the
    validation windows choose among. It reads the target channels' history and the future known
    covariates. It has no network settings (`model.net` empty) and moves no weight by gradient.
    """

    family = "linear"
    supported_options = frozenset()

    def __init__(self, *args, subtract: str = "last", penalties: list[float] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.require_point_head("model=linear")
        self.val_mse_by_penalty: dict[float, float] = {}

    def build_forecaster(self, net: dict) -> ChannelSharedLinear:
        if net:  # a network setting would be silently ignored: say so (a model folder's too)
            raise ValueError(f"model.net: the linear forecaster has no network settings, got {sorted(net)}")
        hp = self.hparams
        penalties = PENALTIES if hp.penalties is None else tuple(hp.penalties)
        return ChannelSharedLinear(
            LinearConfig(hp.context_len, hp.horizon, hp.d_known, hp.subtract, penalties)
        )  # the static features appended to the known covariates are not read (d_known first)

    def solve(self) -> None:
        dm = self.trainer.datamodule
        self.val_mse_by_penalty = self.net.fit(
            window_batches(dm.datasets["train"]), window_batches(dm.datasets["val"])
        )
        self.keep_solved_linear(self.net, self.val_mse_by_penalty, dm)

    def training_step(self, batch: dict, batch_idx: int) -> None:
        # train/loss logged as any model's; None: no optimiser step, the weights are solved for (`on_fit_start`)
        super().training_step(batch, batch_idx)

    def teacher_forced(self, batch: dict):
        return self.predict_target(batch), batch["fut_target"], valid_steps(batch, "fut")

    def predict_target(self, batch: dict) -> torch.Tensor:
        return self.net(batch["hist_target"], batch["fut_known"])  # (B, M, Dy)
