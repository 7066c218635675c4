"""JobSpec messages from what users write: a dict, a YAML or JSON file, or the message itself.

Field names are proto3 JSON names (snake_case or camelCase), enums by name (e.g. algorithm:
ALGORITHM_GRPO), the same as tandem-cli's spec files. An unknown field or a wrong type raises
ValueError naming it, before anything is sent.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Mapping, Union

import yaml
from google.protobuf import json_format

from tandem.trainer.v1 import trainer_pb2

SpecLike = Union[trainer_pb2.JobSpec, Mapping[str, Any], str, os.PathLike]


def job_spec(spec: SpecLike) -> trainer_pb2.JobSpec:
    """The JobSpec `spec` describes; a str or path names a .yaml/.yml or .json file."""
    if isinstance(spec, trainer_pb2.JobSpec):
        return spec
    if isinstance(spec, Mapping):
        return _parse(spec, "the spec")
    path = pathlib.Path(spec)
    try:
        text = path.read_text()
    except OSError as error:
        raise ValueError(f"cannot read spec file {path}: {error.strerror}") from error
    try:
        document = (yaml.safe_load(text) if path.suffix in (".yaml", ".yml")
                    else json.loads(text))
    except (yaml.YAMLError, json.JSONDecodeError) as error:
        raise ValueError(f"spec file {path}: {error}") from error
    if not isinstance(document, Mapping):
        raise ValueError(f"spec file {path}: expected a mapping of JobSpec fields")
    return _parse(document, f"spec file {path}")


def _parse(document: Mapping[str, Any], where: str) -> trainer_pb2.JobSpec:
    try:
        return json_format.ParseDict(document, trainer_pb2.JobSpec())
    except json_format.ParseError as error:
        raise ValueError(f"{where}: {error}") from error

