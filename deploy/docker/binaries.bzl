"""The binaries the image holds (the Dockerfile copies each under its tandem-* name)."""

IMAGE_BINARIES = [
    "//services/trainer",
    "//services/rollout",
    "//services/weight_store",
    "//services/router_replay",
    "//tools/cli:tandem-cli",
    "//tools/health_check",
    "//engine:make_base_model",
]
