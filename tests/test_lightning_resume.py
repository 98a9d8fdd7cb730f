"""A Lightning run stopped mid-epoch resumes from its checkpoint on another number of workers."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "lightning_resume.py"


@pytest.mark.parametrize(
    "workers, resume_workers", [(2, 0), pytest.param(0, 2, marks=pytest.mark.slow)]
)
def test_lightning_resumes_the_rest_of_the_epoch_without_repeats_or_gaps(
    capsys, workers, resume_workers
):
    pytest.importorskip("lightning")
    main = runpy.run_path(str(EXAMPLE))["main"]
    rows = main(["--workers", str(workers), "--resume-workers", str(resume_workers)])
    assert rows["before"] and rows["after"]  # it did stop mid-epoch, and resumed
    assert sorted(rows["before"] + rows["after"]) == rows["whole"]  # every row of epoch 1 once
    assert len(rows["whole"]) == 10_000
    assert "epoch 1 rows once each: True; repeats: 0" in capsys.readouterr().out
