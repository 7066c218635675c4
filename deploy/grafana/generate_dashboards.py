#!/usr/bin/env python3
"""Generates Tandem's Grafana dashboards: this file is their only source.

    deploy/grafana/generate_dashboards.py            # rewrite the dashboards
    deploy/grafana/generate_dashboards.py --check    # fail if the committed JSON drifted

The JSON goes to deploy/helm/tandem/files/dashboards/, which the chart ships as ConfigMaps for
Grafana's sidecar and users can import by hand. Every query may name only metrics the C++ code
exports (found in its sources), recording rules of the chart's rules file, and Prometheus's own
`up`; anything else fails the generator, so a renamed metric cannot leave a dashboard blank.
"""

import argparse
import json
import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).parents[2]  # Not resolved: under Bazel this is the runfiles tree.
OUTPUT_DIR = "deploy/helm/tandem/files/dashboards"
RULES_FILE = "deploy/helm/tandem/files/tandem-rules.yaml"
STEP_METRICS_PROTO = "proto/tandem/trainer/v1/trainer.proto"
# Where metrics are registered. The trainer's step gauges are tandem_trainer_<StepMetrics field>.
METRIC_SOURCES = [
    "common/metrics.cc",
    "common/server.cc",
    "services/rollout/rollout_metrics.cc",
    "services/trainer/api/trainer_metrics.cc",
    "services/weight_store/weight_store_metrics.cc",
    "services/router_replay/router_replay_metrics.cc",
]
PROMETHEUS_METRICS = {"up"}
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")

# ---------------------------------------------------------------- What the code exports.

def exported_metrics(root):
    """Returns {series name} for every series the services can expose."""
    names = set(PROMETHEUS_METRICS)
    for source in METRIC_SOURCES:
        text = (root / source).read_text()
        for match in re.finditer(r'"(tandem_[a-z0-9_]+)"', text):
            name = match.group(1)
            if name.endswith("_"):
                continue  # A prefix, such as the trainer's "tandem_trainer_".
            names.add(name)
            if _registered_as_histogram(text, match.start()):
                names.update(name + suffix for suffix in HISTOGRAM_SERIES)
    names.update("tandem_trainer_" + field for field in step_metrics_fields(root))
    return names


def _registered_as_histogram(text, position):
    """True when the nearest metric builder before `position` makes a histogram."""
    builders = re.findall(r"(Histogram|Counter|Gauge)(?:Family)?\(", text[:position])
    return bool(builders) and builders[-1] == "Histogram"


def step_metrics_fields(root):
    proto = (root / STEP_METRICS_PROTO).read_text()
    body = re.search(r"message StepMetrics \{(.*?)\n\}", proto, re.S).group(1)
    return re.findall(r"^\s*(?:double|int64)\s+(\w+)\s*=", body, re.M)


def recording_rules(root):
    groups = yaml.safe_load((root / RULES_FILE).read_text())["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


def metrics_in(expr):
    """Metric names a PromQL expression selects (label values and strings excluded)."""
    without_strings = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    without_matchers = re.sub(r"\{[^}]*\}", "", without_strings)
    without_groupings = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)",
                               "", without_matchers)
    words = re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_groupings)
    return {word for word in words
            if word.startswith("tandem") or word in PROMETHEUS_METRICS}


# ---------------------------------------------------------------- Panels.

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PANEL_HEIGHT = 8
GRID_WIDTH = 24


# A string, a label matcher block, or a name: what scoped() walks through.
_TOKENS = re.compile(r'"(?:\\.|[^"\\])*"|\{[^}]*\}|[a-zA-Z_:][a-zA-Z0-9_:]*')
NAMESPACE_MATCHER = 'namespace=~"$namespace"'


def scoped(expr):
    """`expr` with every metric it selects limited to the dashboard's namespace variable, so that
    releases in other namespaces never mix in."""
    tokens = list(_TOKENS.finditer(expr))
    out, position, skip = [], 0, False
    for index, token in enumerate(tokens):
        if skip:
            skip = False
            continue
        out.append(expr[position:token.start()])
        position = token.end()
        text = token.group()
        if text.startswith(("{", '"')) or text not in metrics_in(text):
            out.append(text)
            continue
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        if following and following.start() == token.end() and following.group().startswith("{"):
            inner = following.group()[1:-1].strip()
            out.append(f"{text}{{{NAMESPACE_MATCHER}, {inner}}}" if inner else
                       f"{text}{{{NAMESPACE_MATCHER}}}")
            position = following.end()
            skip = True
        else:
            out.append(f"{text}{{{NAMESPACE_MATCHER}}}")
    out.append(expr[position:])
    return "".join(out)


def target(expr, legend):
    return {"expr": scoped(expr), "legendFormat": legend}


def timeseries(title, description, unit, *targets, stacked=False):
    custom = {"fillOpacity": 30, "stacking": {"mode": "normal"}} if stacked else {}
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                    "tooltip": {"mode": "multi"}},
        "targets": list(targets),
    }


def stat(title, description, unit, *targets, mappings=None):
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "fieldConfig": {"defaults": {"unit": unit, "mappings": mappings or []}, "overrides": []},
        "options": {"colorMode": "background", "graphMode": "none",
                    "reduceOptions": {"calcs": ["lastNotNull"]}},
        "targets": list(targets),
    }


def quantiles(histogram, by, legend_prefix=""):
    """p50 and p99 of a latency histogram, per `by` labels."""
    labels = ", ".join(by + ["le"])
    legend = " ".join("{{%s}}" % label for label in by)
    return [target(f"histogram_quantile({q}, sum by ({labels}) "
                   f"(rate({histogram}_bucket[$__rate_interval])))",
                   f"{legend_prefix}{legend} p{int(q * 100)}".strip())
            for q in (0.5, 0.99)]


def step_gauge(field, legend="{{job_id}}"):
    return target(f'tandem_trainer_{field}{{job_id=~"$job_id"}}', legend)


def rate(counter, by=(), selector=""):
    grouping = f"sum by ({', '.join(by)}) " if by else "sum "
    return f"{grouping}(rate({counter}{selector}[$__rate_interval]))"


# ---------------------------------------------------------------- Dashboards.

# up of every target that exported tandem_build_info in the last hour, with its service label.
UP_BY_SERVICE = ("up * on(instance) group_left(service) "
                 "max by (instance, service) (last_over_time(tandem_build_info[1h]))")


def overview():
    up_mappings = [{"type": "value", "options": {"0": {"text": "DOWN", "color": "red"},
                                                 "1": {"text": "UP", "color": "green"}}}]
    handled = "tandem_rpc_server_handled_total"
    failed = rate(handled, ["service", "method", "code"], '{code!="OK"}')
    return "overview", "Tandem / Overview", [
        stat("Services up", "Scrape health of each service: its targets' up, named by their "
             "tandem_build_info (however the scrape jobs are called).", "none",
             target(f"min by (service) ({UP_BY_SERVICE})", "{{service}}"),
             mappings=up_mappings),
        stat("Replicas answering", "Instances answering scrapes, per service.", "none",
             target(f"sum by (service) ({UP_BY_SERVICE})", "{{service}}")),
        stat("Versions running", "Tandem version of each service's processes.", "none",
             target("count by (service, version) (tandem_build_info)", "{{service}} {{version}}")),
        timeseries("RPC rate", "Finished calls per second, per method.", "reqps",
                   target(rate(handled, ["service", "method"]), "{{service}}/{{method}}")),
        timeseries("RPC errors", "Calls that ended with a status other than OK (0 when none).",
                   "reqps",
                   target(f"{failed} or {rate(handled, ['service', 'method'])} * 0",
                          "{{service}}/{{method}} {{code}}")),
        timeseries("RPC error ratio", "Recording rule tandem:rpc_error_ratio (5 m window).",
                   "percentunit", target("tandem:rpc_error_ratio", "{{service}}/{{method}}")),
        timeseries("RPC latency", "Time from receiving a call to sending its status.", "s",
                   *quantiles("tandem_rpc_server_handling_seconds", ["service", "method"])),
        timeseries("RPCs in flight", "Calls started and not yet finished, per service.", "none",
                   target("sum by (service) (tandem_rpc_server_started_total) - "
                          "sum by (service) (tandem_rpc_server_handled_total)", "{{service}}")),
        timeseries("Auth rejections", "Calls refused for a missing or wrong bearer token.",
                   "reqps", target(rate("tandem_auth_rejected_total", ["service"]),
                                   "{{service}}")),
    ], []


def rl_jobs():
    step_split = ["generation_seconds", "route_fetch_seconds", "training_seconds",
                  "publish_seconds", "swap_seconds"]
    return "rl-jobs", "Tandem / RL jobs", [
        stat("Jobs by state", "Jobs the trainer knows, by state.", "none",
             target("sum by (state) (tandem_trainer_jobs)", "{{state}}")),
        stat("Step", "Latest completed step.", "none", step_gauge("step")),
        stat("Policy version", "Adapter version published by the latest step.", "none",
             step_gauge("policy_version")),
        timeseries("Reward", "Mean sequence score.", "none", step_gauge("reward_mean")),
        timeseries("Accuracy", "Share of samples the verifier marked correct.", "percentunit",
                   step_gauge("accuracy")),
        timeseries("Rollout-trainer mismatch", "Mean k3 KL between the rollout's and the "
                   "trainer's token log-probs; reference-policy KL.", "none",
                   step_gauge("mismatch_kl_k3", "{{job_id}} mismatch k3"),
                   step_gauge("ref_kl", "{{job_id}} ref KL")),
        timeseries("Routing disagreement", "Trainer top-k differing from the rollout's, before "
                   "replay; routes missing and recomputed.", "percentunit",
                   step_gauge("routing_disagreement_token_layer", "{{job_id}} token x layer"),
                   step_gauge("routing_disagreement_token", "{{job_id}} token"),
                   step_gauge("missing_route_share", "{{job_id}} missing")),
        timeseries("Importance sampling", "Effective sample size of the IS weights; shares of "
                   "tokens clipped by IS and by the PPO ratio, and of tokens whose rollout "
                   "probability is off by more than a factor e.", "percentunit",
                   step_gauge("is_weight_ess", "{{job_id}} ESS"),
                   step_gauge("is_clipped_share", "{{job_id}} IS clipped"),
                   step_gauge("ppo_clip_share", "{{job_id}} PPO clipped"),
                   step_gauge("large_mismatch_share", "{{job_id}} |log ratio| > 1")),
        timeseries("Step time", "Wall time of each step, split into its phases.", "s",
                   *[step_gauge(field, "{{job_id}} " + field.removesuffix("_seconds"))
                     for field in step_split], stacked=True),
        timeseries("Tokens per second", "Response tokens of the step over its wall time; all "
                   "replicas' sampling rate.", "none",
                   target('tandem_trainer_response_tokens{job_id=~"$job_id"} / '
                          'tandem_trainer_step_seconds{job_id=~"$job_id"}', "{{job_id}} step"),
                   target("tandem:rollout_tokens_per_second", "rollout sampling")),
        timeseries("Loss and gradient norm", "Policy loss; global gradient norm before "
                   "clipping.", "none", step_gauge("loss", "{{job_id}} loss"),
                   step_gauge("grad_norm", "{{job_id}} grad norm")),
        timeseries("Responses", "Mean generated tokens per sample; shares truncated and "
                   "finished on a newer version (partial rollouts).", "none",
                   step_gauge("response_length_mean", "{{job_id}} length"),
                   step_gauge("truncated_share", "{{job_id}} truncated share"),
                   step_gauge("partial_rollout_share", "{{job_id}} partial share")),
        timeseries("Critic (PPO)", "Value loss; share of the returns' variance the old values "
                   "explain.", "none", step_gauge("value_loss", "{{job_id}} value loss"),
                   step_gauge("explained_variance", "{{job_id}} explained variance")),
        timeseries("Expert load by rank", "Expert-parallel jobs: routed rows each trainer "
                   "rank's experts computed in the step (forward and backward) -- the load "
                   "placement balances.", "none",
                   target('tandem_trainer_rank_expert_rows{job_id=~"$job_id"}',
                          "{{job_id}} rank {{rank}}")),
        timeseries("Expert balance", "Expert-parallel jobs balancing experts, each MoE layer on "
                   "its own load: the step's load imbalance per layer (max / mean rows per rank; "
                   "mean over the layers and the worst layer) with the placements before and "
                   "after the experts moved and hot ones were replicated; experts moved and "
                   "replicas made over all layers; seconds in the expert all-to-all.", "none",
                   step_gauge("expert_imbalance_before", "{{job_id}} imbalance before"),
                   step_gauge("expert_imbalance_after", "{{job_id}} imbalance after"),
                   step_gauge("expert_imbalance_worst_before",
                              "{{job_id}} worst layer before"),
                   step_gauge("expert_imbalance_worst_after", "{{job_id}} worst layer after"),
                   step_gauge("experts_moved", "{{job_id}} experts moved"),
                   step_gauge("expert_replicas", "{{job_id}} replicas"),
                   step_gauge("expert_exchange_seconds", "{{job_id}} all-to-all s")),
        timeseries("Expert bytes moved", "Expert-parallel jobs balancing experts: bytes a "
                   "group's ranks sent each other for the step's placements (moved experts' "
                   "weights, LoRA, gradients and moments; replicas' copies).", "bytes",
                   step_gauge("expert_bytes_moved", "{{job_id}} bytes moved")),
        timeseries("Staleness", "Versions between the policy trained and the oldest sample's.",
                   "none", target('tandem_trainer_policy_version{job_id=~"$job_id"} - 1 - '
                                  'tandem_trainer_min_rollout_version{job_id=~"$job_id"}',
                                  "{{job_id}}")),
    ], [job_variable()]


def rollout():
    return "rollout", "Tandem / Rollout", [
        timeseries("Tokens per second", "Tokens sampled, per replica.", "none",
                   target(rate("tandem_rollout_tokens_generated_total", ["instance"]),
                          "{{instance}}")),
        timeseries("Samples per second", "Samples finished and sent, per replica.", "none",
                   target(rate("tandem_rollout_samples_total", ["instance"]), "{{instance}}")),
        timeseries("Time to first token", "Generate call to a sample's first token.", "s",
                   *quantiles("tandem_rollout_time_to_first_token_seconds", [])),
        timeseries("Decode step latency", "One decode step of the batch.", "s",
                   *quantiles("tandem_rollout_decode_step_seconds", [])),
        timeseries("Batch occupancy", "Sequences in the decode batch.", "none",
                   target("tandem_rollout_batch_sequences", "{{instance}}")),
        timeseries("KV cache", "KV cache reserved by admitted sequences, of the budget.",
                   "percentunit", target("tandem_rollout_kv_cache_used_bytes / "
                                         "tandem_rollout_kv_cache_budget_bytes", "{{instance}}")),
        timeseries("Queue", "Positions reserved by samples waiting for admission.", "none",
                   target("tandem_rollout_queued_tokens", "{{instance}}")),
        timeseries("Adapter swap latency", "From weight-store announcing a version to it "
                   "serving.", "s", *quantiles("tandem_rollout_adapter_swap_seconds", [])),
        timeseries("Version served", "Version new requests get, per replica and adapter.",
                   "none", target("tandem_rollout_adapter_version", "{{instance}} {{adapter}}")),
    ], []


def refit():
    return "refit", "Tandem / Refit", [
        timeseries("Publish to serving", "Recording rule tandem:refit_seconds: publish to "
                   "weight-store, then every replica swapped.", "s",
                   target("tandem:refit_seconds", "{{job_id}}")),
        timeseries("Publish and swap per step", "As the trainer measures them.", "s",
                   step_gauge("publish_seconds", "{{job_id}} publish"),
                   step_gauge("swap_seconds", "{{job_id}} swap"), stacked=True),
        timeseries("Store publish latency", "BeginPublish to a successful commit.", "s",
                   *quantiles("tandem_weight_store_publish_seconds", [])),
        timeseries("Store fetch latency", "A FetchTensors stream, or building a UCX read plan.",
                   "s", *quantiles("tandem_weight_store_fetch_seconds", [])),
        timeseries("Bytes in by transport", "Adapter bytes published into the store.", "Bps",
                   target(rate("tandem_weight_store_bytes_in_total", ["transport"]),
                          "{{transport}}")),
        timeseries("Bytes out by transport", "Adapter bytes fetched from the store.", "Bps",
                   target(rate("tandem_weight_store_bytes_out_total", ["transport"]),
                          "{{transport}}")),
        timeseries("Versions held", "Committed adapter versions the store holds.", "none",
                   target("tandem_weight_store_versions", "versions")),
        timeseries("Bytes held", "Bytes of the committed versions held.", "bytes",
                   target("tandem_weight_store_held_bytes", "held")),
        timeseries("Leases and uploads", "Leases not yet released or expired; uploads begun, "
                   "not yet ended.", "none", target("tandem_weight_store_active_leases", "leases"),
                   target("tandem_weight_store_open_uploads", "open uploads")),
    ], [job_variable()]


def router_replay():
    return "router-replay", "Tandem / Router replay", [
        timeseries("Ingest", "Route rows (tokens) newly stored per second.", "none",
                   target("tandem:router_replay_ingest_tokens_per_second", "tokens/s")),
        timeseries("Stored bytes per token", "Encoded bytes written per route row.", "bytes",
                   target(f'{rate("tandem_router_replay_stored_bytes_total")} / '
                          f'{rate("tandem_router_replay_appended_tokens_total")}', "bytes/token")),
        timeseries("Compression", "int16 bytes appended / encoded bytes written, since start.",
                   "none", target("tandem_router_replay_compression_ratio", "ratio")),
        timeseries("Encodings", "Encoded bytes written per second, by block encoding.", "Bps",
                   target(rate("tandem_router_replay_stored_bytes_total", ["encoding"]),
                          "{{encoding}}")),
        timeseries("Fsync latency", "Making an Append stream durable before its reply.", "s",
                   *quantiles("tandem_router_replay_sync_seconds", [])),
        timeseries("Chunk latency", "Validating, encoding and storing one chunk.", "s",
                   *quantiles("tandem_router_replay_append_chunk_seconds", [])),
        timeseries("Held", "Encoded bytes of the records held.", "bytes",
                   target("tandem_router_replay_held_bytes", "held")),
        timeseries("Records", "Records held, by state.", "none",
                   target("tandem_router_replay_records", "{{state}}")),
        timeseries("Capture failures", "Samples whose routes router-replay did not acknowledge; "
                   "rows queued to router-replay.", "none",
                   target(f'{rate("tandem_rollout_route_failures_total")}', "failed samples/s"),
                   target(f'{rate("tandem_rollout_route_rows_sent_total")}', "rows sent/s")),
        timeseries("Fetch", "Route rows sent to the trainer per second.", "none",
                   target(rate("tandem_router_replay_fetched_tokens_total"), "tokens/s")),
        timeseries("Deletions", "Records deleted per second, by reason.", "none",
                   target(rate("tandem_router_replay_deleted_records_total", ["reason"]),
                          "{{reason}}")),
    ], []


DASHBOARDS = [overview, rl_jobs, rollout, refit, router_replay]


def namespace_variable():
    """The release's namespace: every query is limited to it (scoped)."""
    return {"name": "namespace", "label": "Namespace", "type": "query", "datasource": DATASOURCE,
            "query": {"query": "label_values(tandem_build_info, namespace)",
                      "refId": "namespace"},
            "refresh": 2, "includeAll": False, "multi": False}


def job_variable():
    return {"name": "job_id", "label": "Job", "type": "query", "datasource": DATASOURCE,
            "query": {"query": 'label_values(tandem_trainer_step{namespace=~"$namespace"}, job_id)',
                      "refId": "job_id"},
            "refresh": 2, "includeAll": True, "multi": True, "allValue": ".+",
            "current": {"text": "All", "value": "$__all"}}


def dashboard(uid_suffix, title, panels, variables):
    datasource_variable = {"name": "datasource", "label": "Prometheus", "type": "datasource",
                           "query": "prometheus", "current": {}}
    return {
        "uid": f"tandem-{uid_suffix}",
        "title": title,
        "tags": ["tandem"],
        "timezone": "browser",
        "editable": False,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [datasource_variable, namespace_variable()] + variables},
        "links": [{"type": "dashboards", "tags": ["tandem"], "asDropdown": True,
                   "title": "Tandem"}],
        "panels": laid_out(panels),
    }


def laid_out(panels):
    """Three panels per row, numbered, with ids and reference ids filled in."""
    width = GRID_WIDTH // 3
    for index, panel in enumerate(panels):
        panel["id"] = index + 1
        panel["datasource"] = DATASOURCE
        panel["gridPos"] = {"h": PANEL_HEIGHT, "w": width,
                            "x": (index % 3) * width, "y": (index // 3) * PANEL_HEIGHT}
        for ref, query in enumerate(panel["targets"]):
            query["refId"] = chr(ord("A") + ref)
            query["datasource"] = DATASOURCE
    return panels


# ---------------------------------------------------------------- Output and checks.

def generate():
    """Returns {file name: JSON text}."""
    return {f"tandem-{uid}.json": json.dumps(dashboard(uid, title, panels, variables),
                                             indent=2) + "\n"
            for uid, title, panels, variables in (make() for make in DASHBOARDS)}


def queries(files):
    for name, text in sorted(files.items()):
        for panel in json.loads(text)["panels"]:
            for query in panel["targets"]:
                yield name, panel["title"], query["expr"]


def unknown_metrics(files, root):
    known = exported_metrics(root) | recording_rules(root)
    return [f"{name}: panel '{title}' queries {sorted(metrics_in(expr) - known)}: {expr}"
            for name, title, expr in queries(files) if metrics_in(expr) - known]


def drift(files, out_dir):
    on_disk = {path.name for path in out_dir.glob("*.json")}
    stale = sorted(on_disk - files.keys())
    changed = sorted(name for name, text in files.items()
                     if name not in on_disk or (out_dir / name).read_text() != text)
    return [f"{name} differs from the generator" for name in changed] + \
           [f"{name} is not generated by this program" for name in stale]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="fail if the committed dashboards differ from the generator")
    args = parser.parse_args()

    files = generate()
    problems = unknown_metrics(files, ROOT)
    if problems:
        sys.exit("generate_dashboards: queries name metrics nobody exports:\n  " +
                 "\n  ".join(problems))
    out_dir = ROOT / OUTPUT_DIR
    if args.check:
        problems = drift(files, out_dir)
        if problems:
            sys.exit("generate_dashboards: " + "; ".join(problems) +
                     "\nrun deploy/grafana/generate_dashboards.py to regenerate")
        print(f"generate_dashboards: {len(files)} dashboards up to date")
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in out_dir.glob("*.json"):
            if stale.name not in files:
                stale.unlink()
        for name, text in files.items():
            (out_dir / name).write_text(text)
        print(f"generate_dashboards: wrote {len(files)} dashboards to {OUTPUT_DIR}")


if __name__ == "__main__":
    main()
