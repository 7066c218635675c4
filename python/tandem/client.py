"""The client of a Tandem deployment: jobs on the trainer, adapters on the weight-store, routes
on router-replay."""

from __future__ import annotations

import dataclasses
import os
import uuid
from typing import Dict, Iterable, Iterator, List, Optional, Tuple, Union

import numpy as np

from tandem import peft
from tandem.connection import Connection, TlsLike
from tandem.job import Job
from tandem.routerreplay.v1 import router_replay_pb2, router_replay_pb2_grpc
from tandem.spec import SpecLike, job_spec
from tandem.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from tandem.type.v1 import common_pb2
from tandem.weightstore.v1 import weight_store_pb2, weight_store_pb2_grpc

_FLOAT_DTYPES = {common_pb2.DTYPE_F32: np.float32, common_pb2.DTYPE_F16: np.float16}


def _naming(job: str) -> Dict[str, str]:
    """The request fields that name a job given by id or by resource name."""
    return {"name": job} if job.startswith("jobs/") else {"job_id": job}


@dataclasses.dataclass
class AdapterVersion:
    """One committed version of an adapter: its manifest and its tensors by name."""

    adapter_name: str
    version: int
    manifest: weight_store_pb2.Manifest
    tensors: Dict[str, np.ndarray]


@dataclasses.dataclass
class Routes:
    """The recorded routes of one sample: experts[token, i, k] is the k-th expert chosen at MoE
    layer layers[i] for the token (int16; -1 where a partial record has no route yet)."""

    key: common_pb2.RouteRecordKey
    complete: bool
    layers: List[int]
    num_experts: int
    experts: np.ndarray


class Client:
    """Connects to the trainer's Job API at `target` (and, for adapters and routes, to the
    weight-store and router-replay at the addresses given).

    token: the bearer token the services require (their --auth_token_file), if any.
    tls: None for plaintext, True for TLS with the system's roots, or a tandem.Tls.
    timeout: seconds per unary call. Every failed call raises tandem.TandemError.
    """

    def __init__(self, target: str = "127.0.0.1:50051", *, token: Optional[str] = None,
                 tls: TlsLike = None, weight_store: Optional[str] = None,
                 router_replay: Optional[str] = None, timeout: float = 30.0):
        def connect(address: str) -> Connection:
            return Connection(address, token=token, tls=tls, timeout=timeout)

        self._trainer = connect(target)
        self._jobs = trainer_pb2_grpc.JobServiceStub(self._trainer.channel)
        self._weight_store = connect(weight_store) if weight_store else None
        self._router_replay = connect(router_replay) if router_replay else None

    def close(self) -> None:
        for connection in (self._trainer, self._weight_store, self._router_replay):
            if connection:
                connection.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_) -> None:
        self.close()

    # Jobs.

    def submit(self, spec: SpecLike, request_id: Optional[str] = None) -> Job:
        """Creates a job from a JobSpec, a dict or a YAML/JSON file; returns it (QUEUED).

        A retry with the same request_id returns the same job; a new id is made when none is
        given. A local problem with the spec raises ValueError, one the trainer finds raises
        TandemError (INVALID_ARGUMENT, with field_violations).
        """
        request = trainer_pb2.CreateJobRequest(request_id=request_id or f"py-{uuid.uuid4().hex}",
                                               spec=job_spec(spec))
        return Job(self, self._trainer.call(self._jobs.CreateJob, request))

    def get_job(self, job: str) -> Job:
        """The job with this id, or this resource name ("jobs/{id}")."""
        return Job(self, self._trainer.call(self._jobs.GetJob,
                                            trainer_pb2.GetJobRequest(**_naming(job))))

    def list_jobs(self, states: Iterable[Union[str, int]] = (), page_size: int = 50
                  ) -> Iterator[Job]:
        """Every job (newest first), or those in `states` (names or enum values)."""
        request = trainer_pb2.ListJobsRequest(
            page_size=page_size,
            states=[trainer_pb2.JobState.Value(s) if isinstance(s, str) else s for s in states])
        while True:
            page = self._trainer.call(self._jobs.ListJobs, request)
            for proto in page.jobs:
                yield Job(self, proto)
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    def _cancel(self, job_id: str) -> trainer_pb2.Job:
        return self._trainer.call(self._jobs.CancelJob,
                                  trainer_pb2.CancelJobRequest(**_naming(job_id)))

    def _watch(self, job_id: str) -> Iterator[trainer_pb2.WatchJobResponse]:
        return self._trainer.stream(self._jobs.WatchJob,
                                    trainer_pb2.WatchJobRequest(**_naming(job_id)))

    # Adapters.

    def fetch_adapter(self, adapter_name: str, version: Optional[int] = None, *,
                      stack_experts: bool = False, dtype: str = "F32") -> AdapterVersion:
        """A version (default the latest) as named numpy arrays under canonical LoRA names
        (see tandem.type.v1.LoraConfig), converted to `dtype` ("F32" or "F16"); with
        stack_experts, each layer's per-expert tensors as one [experts, ...] array."""
        manifest = self._manifest(adapter_name, version)
        target = weight_store_pb2.TargetLayout(
            naming=weight_store_pb2.TENSOR_NAMING_CANONICAL, stack_experts=stack_experts,
            dtype=common_pb2.Dtype.Value(f"DTYPE_{dtype}"))
        tensors = self._fetch_tensors(adapter_name, manifest.version, target)
        return AdapterVersion(adapter_name, manifest.version, manifest, tensors)

    def export_adapter(self, job: Union[Job, str], directory: Union[str, os.PathLike],
                       version: Optional[int] = None,
                       base_model_name_or_path: Optional[str] = None) -> int:
        """Writes a job's adapter version (default its latest) as a PEFT LoRA directory, like
        `tandem-cli export`; returns the version. base_model_name_or_path goes into
        adapter_config.json (default: the job's base_model_path)."""
        job = self.get_job(job) if isinstance(job, str) else job.get()
        adapter = self.fetch_adapter(job.spec.adapter_name, version)
        peft.write_directory(directory, adapter.manifest, adapter.tensors,
                             base_model_name_or_path or job.spec.base_model_path)
        return adapter.version

    def _store(self) -> Tuple[Connection, weight_store_pb2_grpc.WeightStoreServiceStub]:
        if self._weight_store is None:
            raise ValueError("this Client has no weight_store address")
        return self._weight_store, weight_store_pb2_grpc.WeightStoreServiceStub(
            self._weight_store.channel)

    def _manifest(self, adapter_name: str, version: Optional[int]) -> weight_store_pb2.Manifest:
        connection, store = self._store()
        selector = common_pb2.AdapterSelector(adapter_name=adapter_name)
        if version is None:
            selector.latest = True
        else:
            selector.exact_version = version
        request = weight_store_pb2.GetManifestRequest(adapter=selector)
        return connection.call(store.GetManifest, request).manifest

    def _fetch_tensors(self, adapter_name: str, version: int,
                       target: weight_store_pb2.TargetLayout) -> Dict[str, np.ndarray]:
        connection, store = self._store()
        request = weight_store_pb2.FetchTensorsRequest(adapter_name=adapter_name, version=version,
                                                       target=target)
        specs: Dict[str, common_pb2.TensorSpec] = {}
        buffers: Dict[str, bytearray] = {}
        current = None
        for chunk in connection.stream(store.FetchTensors, request, timeout=connection.timeout):
            if chunk.HasField("tensor"):
                current = chunk.tensor.spec.name
                specs[current] = chunk.tensor.spec
                buffers[current] = bytearray(chunk.tensor.byte_size)
            buffers[current][chunk.offset:chunk.offset + len(chunk.data)] = chunk.data
        return {name: np.frombuffer(bytes(buffers[name]), dtype=_FLOAT_DTYPES[spec.dtype])
                .reshape(tuple(spec.shape)) for name, spec in specs.items()}

    # Routes.

    def fetch_routes(self, job: Union[Job, str], versions: Optional[Tuple[int, int]] = None,
                     all_attempts: bool = False) -> Iterator[Routes]:
        """The sealed route records of a job, one Routes per sample, ordered by (policy version,
        sample id, attempt); versions = (begin, end) limits the policy versions (end 0: none)."""
        if self._router_replay is None:
            raise ValueError("this Client has no router_replay address")
        stub = router_replay_pb2_grpc.RouterReplayServiceStub(self._router_replay.channel)
        selection = router_replay_pb2.JobRecords(
            job_id=job if isinstance(job, str) else job.id, all_attempts=all_attempts)
        if versions is not None:
            selection.versions.begin, selection.versions.end = versions
        request = router_replay_pb2.FetchRoutesRequest(job=selection)
        record: Optional[Routes] = None
        parts: List[bytes] = []
        for message in self._router_replay.stream(stub.FetchRoutes, request):
            if message.row_offset == 0:
                record = Routes(key=message.key,
                                complete=message.status == router_replay_pb2.RECORD_STATUS_COMPLETE,
                                layers=list(message.layer_indices),
                                num_experts=message.num_experts, experts=np.empty(0))
                parts = []
            parts.append(message.rows)
            if message.row_offset + message.num_rows == message.requested_rows:
                rows = np.frombuffer(b"".join(parts), dtype="<i2").astype(np.int16)
                record.experts = rows.reshape(message.requested_rows, len(record.layers),
                                              message.top_k)
                yield record
