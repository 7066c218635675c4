#!/usr/bin/env bash
# Runs the layer check on the dependency graph genquery wrote.
exec python3 "$(dirname "$0")/check_layers.py" "$1"
