"""The SDK against the real four services (conftest.py): a job end to end, its adapter and
routes, watch and cancel, and the error paths."""

from __future__ import annotations

import json
import os
import subprocess

import grpc
import numpy as np
import pytest
import yaml

import tandem
from conftest import binary
from tandem import safetensors

STEPS = 3


def spec(deployment, steps=STEPS, **overrides):
    document = {
        "display_name": "sdk-test",
        "task": {"name": "addition", "params": {"digits": "1"}},
        "base_model_path": deployment.base_model,
        "lora": {"rank": 4, "alpha": 8},
        "algorithm": "ALGORITHM_GRPO",
        "algorithm_config": {"learning_rate": 0.005, "max_grad_norm": 1.0},
        "routing_replay": "ROUTING_REPLAY_MODE_R3",
        "prompts_per_step": 8,
        "group_size": 4,
        "num_steps": steps,
        "micro_batch_size": 32,
        "sampling": {"temperature": 0.6, "max_new_tokens": 4},
        "seed": 3,
    }
    document.update(overrides)
    return document


@pytest.fixture
def client(deployment):
    with tandem.Client(deployment.address("trainer"), token=deployment.token,
                       weight_store=deployment.address("weight_store"),
                       router_replay=deployment.address("router_replay")) as client:
        yield client


@pytest.fixture(scope="module")
def finished_job(deployment, tmp_path_factory):
    """A job submitted from a YAML file and watched to the end, with what watch yielded."""
    path = tmp_path_factory.mktemp("spec") / "job.yaml"
    path.write_text(yaml.safe_dump(spec(deployment)))
    with tandem.Client(deployment.address("trainer"), token=deployment.token) as client:
        job = client.submit(path, request_id="sdk-finished-job")
        steps = [metrics.step for metrics in job.watch(progress=True)]
        yield job, steps


def test_a_job_runs_to_the_end_and_watch_yields_its_steps(finished_job, client):
    job, steps = finished_job
    assert job.state == "JOB_STATE_SUCCEEDED", job.proto.error_message
    assert steps and steps[-1] == STEPS and steps == sorted(set(steps))
    assert job.proto.current_step == STEPS and job.policy_version >= STEPS
    assert client.get_job(job.id).state == "JOB_STATE_SUCCEEDED"
    assert job.name == f"jobs/{job.id}" and client.get_job(job.name).id == job.id
    assert job.id in [listed.id for listed in client.list_jobs(states=["JOB_STATE_SUCCEEDED"])]
    # Watching a job that already ended returns at once, with no steps.
    assert list(client.get_job(job.id).watch()) == []


def test_a_retried_submit_returns_the_same_job(finished_job, client, deployment):
    job, _ = finished_job
    again = client.submit(spec(deployment), request_id="sdk-finished-job")
    assert again.id == job.id
    with pytest.raises(tandem.TandemError) as raised:
        client.submit(spec(deployment, steps=4), request_id="sdk-finished-job")
    assert raised.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert raised.value.reason == "REQUEST_ID_REUSED"


def test_the_exported_adapter_matches_tandem_cli_and_the_fetched_tensors(
        finished_job, client, deployment, tmp_path):
    job, _ = finished_job
    version = client.export_adapter(job, tmp_path / "sdk", base_model_name_or_path="base")
    assert version == job.policy_version
    subprocess.run([binary("tools/cli/tandem-cli"), "export", job.id, f"--out={tmp_path / 'cli'}",
                    "--base_model_name=base", f"--trainer={deployment.address('trainer')}",
                    f"--weight_store={deployment.address('weight_store')}",
                    f"--auth_token_file={deployment.workdir / 'auth_token'}"],
                   check=True, stdout=subprocess.DEVNULL)
    ours = safetensors.read(tmp_path / "sdk" / "adapter_model.safetensors")
    theirs = safetensors.read(tmp_path / "cli" / "adapter_model.safetensors")
    assert sorted(ours) == sorted(theirs) and ours
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    config = json.loads((tmp_path / "sdk" / "adapter_config.json").read_text())
    assert config == json.loads((tmp_path / "cli" / "adapter_config.json").read_text())

    fetched = client.fetch_adapter(job.spec.adapter_name, version)
    assert fetched.version == version
    for name, tensor in fetched.tensors.items():
        exported = ours.get("base_model.model." + name)
        if exported is not None:  # Shared expert sides are exported per expert.
            np.testing.assert_array_equal(tensor, exported, err_msg=name)
    stacked = client.fetch_adapter(job.spec.adapter_name, version, stack_experts=True)
    per_expert = [name for name in fetched.tensors if ".mlp.experts.0." in name]
    assert per_expert, "the default layout has per-expert tensors"
    for name in per_expert:
        layer = stacked.tensors[name.replace(".experts.0.", ".experts.")]
        np.testing.assert_array_equal(layer[0], fetched.tensors[name])


def test_the_routes_of_a_job_come_as_arrays(finished_job, client):
    job, _ = finished_job
    records = list(client.fetch_routes(job))
    samples_per_step = job.spec.prompts_per_step * job.spec.group_size
    assert len(records) == STEPS * samples_per_step
    first = records[0]
    assert first.complete and first.key.job_id == job.id
    assert first.experts.dtype == np.int16 and first.experts.ndim == 3
    assert first.experts.shape[1] == len(first.layers) and first.experts.shape[2] >= 1
    for record in records:
        assert record.experts.min() >= 0 and record.experts.max() < record.num_experts
    versions = sorted({record.key.policy_version for record in records})
    assert len(versions) == STEPS, "each step generates with the version the one before published"
    one_version = list(client.fetch_routes(job, versions=(versions[1], versions[1] + 1)))
    assert len(one_version) == samples_per_step
    assert {record.key.policy_version for record in one_version} == {versions[1]}


def test_watch_then_cancel(client, deployment):
    job = client.submit(spec(deployment, steps=500))
    for metrics in job.watch():
        assert metrics.step >= 1
        job.cancel()
        break
    assert job.state in ("JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED")
    assert job.wait() == "JOB_STATE_CANCELLED"
    assert job.cancel().state == "JOB_STATE_CANCELLED", "cancelling again changes nothing"


def test_a_bad_field_comes_back_naming_it(client, deployment):
    with pytest.raises(tandem.TandemError) as raised:
        client.submit(spec(deployment, group_size=-1))
    error = raised.value
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in error.field_violations] == ["spec.group_size"]
    assert error.field_violations[0].description
    assert error.reason == "INVALID_FIELD"


def test_an_unknown_job_is_not_found_by_reason(client):
    with pytest.raises(tandem.TandemError) as raised:
        client.get_job("job-nope")
    assert raised.value.code == grpc.StatusCode.NOT_FOUND
    assert raised.value.reason == "JOB_NOT_FOUND"


def test_a_spec_with_an_unknown_field_is_refused_before_sending(client, deployment, tmp_path):
    with pytest.raises(ValueError, match="no_such_field"):
        client.submit(spec(deployment, no_such_field=1))
    with pytest.raises(ValueError, match="cannot read spec file"):
        client.submit(os.fspath(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a mapping"):
        client.submit(bad)


def test_a_call_without_the_token_is_unauthenticated(deployment):
    with tandem.Client(deployment.address("trainer")) as anonymous:
        with pytest.raises(tandem.TandemError) as raised:
            list(anonymous.list_jobs())
    assert raised.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_adapters_and_routes_need_their_service_addresses(deployment):
    with tandem.Client(deployment.address("trainer"), token=deployment.token) as trainer_only:
        with pytest.raises(ValueError, match="weight_store"):
            trainer_only.fetch_adapter("anything")
        with pytest.raises(ValueError, match="router_replay"):
            list(trainer_only.fetch_routes("job-x"))
