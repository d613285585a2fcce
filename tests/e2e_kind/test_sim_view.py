from __future__ import annotations

from typing import Any

import pytest

from e2e.lib.sim_view import describe_gpu, gpu_by_uuid, gpu_views, mig_instance_count, mps_daemons

STATE: dict[str, Any] = {
    "hardware": "dgx-h100",
    "gpus": [
        {"uuid": "GPU-a", "mig_current": False, "compute_mode": 0, "timeslice": 3, "gpu_instances": []},
        {
            "uuid": "GPU-b",
            "mig_current": True,
            "compute_mode": 0,
            "timeslice": 0,
            "gpu_instances": [
                {"gi_id": 1, "profile_id": 19, "start": 0, "size": 1, "compute_instances": []},
                {"gi_id": 2, "profile": "2g.20gb", "start": 2, "size": 2},
            ],
        },
        {"uuid": "GPU-c", "mig_current": False, "compute_mode": 3, "timeslice": 0, "gpu_instances": []},
    ],
    "mps": {"daemons": {"claim-1": {"gpus": ["GPU-c"], "active_thread_percentage": 50}}},
}


def test_views_translate_modes_and_list_instances() -> None:
    views = gpu_views(STATE)
    assert [v.timeslice for v in views] == ["Long", "Default", "Default"]
    assert views[2].compute_mode == "ExclusiveProcess"
    assert views[1].mig_instances == ("gi-profile-19@0", "2g.20gb")
    assert mig_instance_count(STATE) == 2
    assert gpu_by_uuid(STATE, "GPU-b").mig_enabled


def test_unknown_uuid_and_bad_state_are_named() -> None:
    with pytest.raises(KeyError, match="GPU-z"):
        gpu_by_uuid(STATE, "GPU-z")
    with pytest.raises(ValueError, match="no 'gpus' list"):
        gpu_views({"hardware": "x"})


def test_mps_daemons_from_mapping_or_list() -> None:
    assert mps_daemons(STATE) == [{"id": "claim-1", "gpus": ["GPU-c"], "active_thread_percentage": 50}]
    assert mps_daemons({"gpus": [], "mps": [{"id": "x"}]}) == [{"id": "x"}]
    assert mps_daemons({"gpus": []}) == []


def test_description_for_the_demo() -> None:
    views = gpu_views(STATE)
    assert describe_gpu(views[0]) == "time-slice Long"
    assert describe_gpu(views[2]) == "compute mode ExclusiveProcess"
    assert describe_gpu(views[1]).startswith("MIG ")
