"""Tandem's Python SDK: submit and watch RL jobs, export adapters, fetch routes and adapters.

    import tandem
    with tandem.Client("127.0.0.1:50051", token=token, weight_store="127.0.0.1:50053") as client:
        job = client.submit("jobs/demo.yaml")
        for metrics in job.watch(progress=True):
            ...
        client.export_adapter(job, "my-adapter")

The generated messages and stubs of the public API are importable too, e.g.
tandem.trainer.v1.trainer_pb2.
"""

from tandem.client import AdapterVersion, Client, Routes
from tandem.connection import Tls
from tandem.errors import FieldViolation, TandemError
from tandem.job import Job
from tandem.spec import job_spec

__all__ = ["AdapterVersion", "Client", "FieldViolation", "Job", "Routes", "TandemError", "Tls",
           "job_spec"]
