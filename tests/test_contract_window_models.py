"""The contract every task class of every job keeps (tests/contract.py): reconstruction's and masked fill-in's task classes."""

from __future__ import annotations

import pytest

from contract import (  # noqa: F401 (the contract's tests, collected here)
    FILES,
    answers_fixture,
    test_a_hostile_folder_of_its_kind_is_one_line_without_allocating_or_running_code,
    test_a_job_s_figures_come_only_through_its_figures_member_and_none_when_figures_is_false,
    test_predict_py_tsformer_serve_and_pyfunc_answer_what_the_predictor_answers,
    test_the_printed_command_runs_from_another_folder_with_a_bare_path,
    test_the_run_is_named_and_tagged_after_its_job_and_writes_its_model_folder,
    test_tsformer_serve_names_the_job_and_writes_one_line_per_request,
    trained_fixture,
)

pytestmark = pytest.mark.slow  # each task class trains once

trained = trained_fixture(FILES["window_models"])
answers = answers_fixture()
