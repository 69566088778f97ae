"""Sweeps beyond one process: Hydra's submitit launcher (its local executor, the same code path as
``submitit_slurm`` minus the scheduler) gives the records a serial run gives.

The joblib launcher is tested in ``test_run.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness.records import load_records
from harness.run import CONF_DIR, run
from tasks.data import SHARED_DATA_DIR as DATA

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"offline datasets not found at {DATA}")
COLUMNS = ["output_hash", "new_tokens", "steps", "status", "job_id", "variant"]


def test_submitit_local_sweep_equals_a_serial_run(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from test_run import save_tiny_checkpoint

    ckpt = save_tiny_checkpoint(tmp_path / "ckpt")
    common = [f"model.name={ckpt}", "task=gsm8k", "limit=2", "max_new_tokens=8", f"data_dir={DATA}"]
    out = subprocess.run(
        [sys.executable, "-m", "harness.run", "-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
         "decoder=ar,pld", *common, f"results_dir={tmp_path / 'sweep'}", f"hydra.sweep.dir={tmp_path / 'mr'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert list((tmp_path / "mr" / ".submitit").iterdir())  # the jobs went through submitit

    for decoder in ("ar", "pld"):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            run(compose(config_name="config", overrides=[*common, f"decoder={decoder}",
                                                         f"results_dir={tmp_path / 'serial'}"]))
    keys = ["decoder", "task", "example_id", "turn"]
    sweep = load_records(tmp_path / "sweep").set_index(keys).sort_index()[COLUMNS]
    serial = load_records(tmp_path / "serial").set_index(keys).sort_index()[COLUMNS]
    assert len(sweep) == 4 and sweep.equals(serial)
