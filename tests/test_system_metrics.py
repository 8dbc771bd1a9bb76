"""System metrics: with `system_metrics.enabled=true` the run holds MLflow's system/* metrics (CPU,
memory, ...), sampled while it was open; switched off (the default), none."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from conftest import TINY
from tsformer.train import compose_config, run

# every test here trains through train.py (or reads a module fixture that does)
pytestmark = pytest.mark.slow

SAMPLED = ["system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"]


@pytest.mark.parametrize("enabled", [True, False])
def test_system_metrics_switch(enabled, in_tmp):
    # The monitor stops when fitting ends (the run leaves RUNNING): the fit must outlast the first
    # sample by a wide margin, or a fast machine records none (TINY's 3 steps at a 0.2 s interval did, once).
    longer = ["trainer.max_epochs=2", "trainer.limit_train_batches=20"]  # after TINY: the later value wins
    overrides = [
        *TINY,
        *longer,
        f"system_metrics.enabled={str(enabled).lower()}",
        "system_metrics.sampling_interval=0.05",
    ]
    result = run(compose_config(overrides, in_tmp / "out"))

    client = MlflowClient(f"sqlite:///{in_tmp / 'mlflow.db'}")
    metrics = client.get_run(result.run_id).data.metrics
    system = {name for name in metrics if name.startswith("system/")}
    if enabled:
        for name in SAMPLED:
            assert name in system, (name, system)
            history = client.get_metric_history(result.run_id, name)
            assert [m.step for m in history] == list(range(len(history)))  # one step per sample
        memory = client.get_metric_history(result.run_id, "system/system_memory_usage_megabytes")
        assert all(m.value > 0 for m in memory)  # (CPU % may read 0 at the first sample: psutil's first call)
    else:
        assert not system
