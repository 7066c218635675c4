"""A submitted job: its current state, its step metrics as they come, and cancellation."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Iterator, TextIO

from tandem.trainer.v1 import trainer_pb2

if TYPE_CHECKING:
    from tandem.client import Client

TERMINAL_STATES = frozenset({trainer_pb2.JOB_STATE_SUCCEEDED, trainer_pb2.JOB_STATE_FAILED,
                             trainer_pb2.JOB_STATE_CANCELLED})


class Job:
    """A job of the trainer's Job API; `proto` is the tandem.trainer.v1.Job last seen."""

    def __init__(self, client: "Client", proto: trainer_pb2.Job):
        self._client = client
        self.proto = proto

    @property
    def id(self) -> str:
        return self.proto.id

    @property
    def name(self) -> str:
        """The job's resource name, "jobs/{id}"."""
        return self.proto.name

    @property
    def state(self) -> str:
        """The state's name, e.g. "JOB_STATE_RUNNING"."""
        return trainer_pb2.JobState.Name(self.proto.state)

    @property
    def done(self) -> bool:
        return self.proto.state in TERMINAL_STATES

    @property
    def spec(self) -> trainer_pb2.JobSpec:
        """The spec as the job runs it, every default written out."""
        return self.proto.spec

    @property
    def policy_version(self) -> int:
        """The latest adapter version the job published; 0 before the first."""
        return self.proto.policy_version

    def get(self) -> "Job":
        """Reads the job again; returns self."""
        self.proto = self._client.get_job(self.id).proto
        return self

    def cancel(self) -> "Job":
        """Asks the trainer to cancel; returns self, CANCELLING or already CANCELLED."""
        self.proto = self._client._cancel(self.id)
        return self

    def watch(self, progress: bool = False, out: TextIO = sys.stderr
              ) -> Iterator[trainer_pb2.StepMetrics]:
        """Each completed step's metrics until the job ends (also when it already has).

        With progress=True, a progress bar of steps and the latest reward goes to `out`. A
        reader that falls behind may skip steps (the trainer coalesces them); the job after the
        last event is in `proto`.
        """
        bar = _ProgressBar(out) if progress else None
        for event in self._client._watch(self.id):
            self.proto = event.job
            if event.type == trainer_pb2.WATCH_EVENT_TYPE_STEP_COMPLETED:
                if bar:
                    bar.show(self.proto)
                yield self.proto.latest_metrics
            if self.done:
                break
        if bar:
            bar.finish(self.proto)

    def wait(self, progress: bool = False) -> str:
        """Waits for the job to end; returns its final state's name."""
        for _ in self.watch(progress=progress):
            pass
        return self.state

    def __repr__(self) -> str:
        return (f"Job(id={self.id!r}, state={self.state}, step={self.proto.current_step}/"
                f"{self.proto.spec.num_steps})")


class _ProgressBar:
    WIDTH = 30

    def __init__(self, out: TextIO):
        self._out = out

    def show(self, job: trainer_pb2.Job) -> None:
        total = max(job.spec.num_steps, 1)
        filled = self.WIDTH * min(job.current_step, total) // total
        metrics = job.latest_metrics
        self._out.write(f"\r{job.id} [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                        f"{job.current_step}/{total} reward {metrics.reward_mean:.3f} "
                        f"accuracy {metrics.accuracy:.3f}")
        self._out.flush()

    def finish(self, job: trainer_pb2.Job) -> None:
        self._out.write(f"\n{job.id} {trainer_pb2.JobState.Name(job.state)}\n")
        self._out.flush()
