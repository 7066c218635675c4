// Validates what the chart takes and what it renders, as `helm install` and the API server
// would, with the npm packages in tools/npm (run tools/setup first):
//   node validate.cjs values CHART_DIR [VALUES_FILE...]  merged values against values.schema.json
//   node validate.cjs manifests RENDERED.yaml             every object against its OpenAPI schema,
//                                                         names and labels against their formats
//   node validate.cjs podsecurity RENDERED.yaml           the Pod Security level its pods need
// Exits 1 naming the file, object and field of every problem.
"use strict";
const fs = require("fs");
const path = require("path");
const { createRequire } = require("module");

const npm = createRequire(path.join(__dirname, "../../../../tools/npm/package.json"));
const YAML = npm("yaml");
const Ajv = npm("ajv");

// apiVersion -> the module of kubernetes-models (or a CRD package) holding its kinds.
const MODEL_MODULES = {
  v1: "kubernetes-models/v1",
  "apps/v1": "kubernetes-models/apps/v1",
  "policy/v1": "kubernetes-models/policy/v1",
  "networking.k8s.io/v1": "kubernetes-models/networking.k8s.io/v1",
  "monitoring.coreos.com/v1": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1",
  "cert-manager.io/v1": "@kubernetes-models/cert-manager/cert-manager.io/v1",
};

// Helm's value coalescing: maps merge key by key, everything else is replaced, null deletes.
function mergeValues(base, overrides) {
  for (const [key, value] of Object.entries(overrides ?? {})) {
    if (value === null) delete base[key];
    else if (isMap(base[key]) && isMap(value)) mergeValues(base[key], value);
    else base[key] = value;
  }
  return base;
}

function isMap(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function readYaml(file) {
  return YAML.parse(fs.readFileSync(file, "utf8"));
}

function validateValues(chartDir, files) {
  const schema = JSON.parse(fs.readFileSync(path.join(chartDir, "values.schema.json"), "utf8"));
  const check = new Ajv({ allErrors: true, strict: false }).compile(schema);
  const problems = [];
  for (const file of files.length ? files : [null]) {
    const values = mergeValues(readYaml(path.join(chartDir, "values.yaml")),
                               file ? readYaml(file) : {});
    if (!check(values)) {
      for (const error of check.errors) {
        const where = error.instancePath || "(root)";
        const extra = error.params.additionalProperty ? ` '${error.params.additionalProperty}'` : "";
        problems.push(`${file ?? "values.yaml"}: ${where}: ${error.message}${extra}`);
      }
    }
  }
  return problems;
}

// Name limits the API server and controllers impose beyond the schemas: a Service's name is a
// DNS label (63); a StatefulSet's pods carry controller-revision-hash = name + "-" + 10
// characters, a label value (63), so the name may have 52; everything else a DNS subdomain.
const NAME_LIMITS = { Service: 63, StatefulSet: 52 };
// And their form: a Service's name is a DNS-1035 label (a letter first, no dots); a
// StatefulSet's a DNS-1123 label (its pods' names are their hostnames); the rest DNS-1123
// subdomains. A release name may start with a digit or hold a dot; the names made from it may not.
const DNS1035_LABEL = /^[a-z]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const NAME_FORMATS = {
  Service: [DNS1035_LABEL, "a DNS-1035 label (a lowercase letter first; letters, digits, '-')"],
  StatefulSet: [DNS1123_LABEL, "a DNS-1123 label (lowercase letters, digits, '-')"],
};
const SUBDOMAIN_FORMAT = [DNS1123_SUBDOMAIN, "a DNS-1123 subdomain"];
// A label's value, and the name part of its key: at most 63, alphanumerics at both ends.
const LABEL_NAME = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;

function validateName(object) {
  const problems = [];
  const name = object.metadata?.name ?? "";
  const limit = NAME_LIMITS[object.kind] ?? 253;
  if (name.length > limit) problems.push(`name has ${name.length} characters; ${object.kind} allows ${limit}`);
  const [format, what] = NAME_FORMATS[object.kind] ?? SUBDOMAIN_FORMAT;
  if (!format.test(name)) problems.push(`name ${JSON.stringify(name)} is not ${what}`);
  return problems;
}

function labelProblems(labels, where) {
  const problems = [];
  for (const [key, value] of Object.entries(labels ?? {})) {
    const slash = key.lastIndexOf("/");
    const prefix = slash < 0 ? "" : key.slice(0, slash);
    const keyName = key.slice(slash + 1);
    if ((prefix && (prefix.length > 253 || !DNS1123_SUBDOMAIN.test(prefix))) ||
        keyName.length > 63 || !LABEL_NAME.test(keyName)) {
      problems.push(`${where}: label key ${JSON.stringify(key)} is not valid`);
    }
    const text = String(value);
    if (text.length > 63 || (text !== "" && !LABEL_NAME.test(text))) {
      problems.push(`${where}: label ${key}=${JSON.stringify(text)} is not a valid label value`);
    }
  }
  return problems;
}

// Every Kubernetes label map of an object: metadata labels (the object's, its pod template's,
// its claim templates') and selectors. A PrometheusRule's alert labels are Prometheus labels,
// whose values may be any text: not walked.
function validateLabels(object) {
  const problems = [];
  const walk = (node, where) => {
    if (Array.isArray(node)) {
      node.forEach((item, index) => walk(item, `${where}[${index}]`));
    } else if (node !== null && typeof node === "object") {
      for (const [key, value] of Object.entries(node)) {
        if ((key === "labels" || key === "matchLabels") && value && typeof value === "object") {
          problems.push(...labelProblems(value, `${where}.${key}`));
        } else if (!(object.kind === "PrometheusRule" && key === "spec" && where === "")) {
          walk(value, `${where}.${key}`);
        }
      }
    }
  };
  walk(object, "");
  // A Service's selector is a plain label map.
  if (object.kind === "Service") problems.push(...labelProblems(object.spec?.selector, ".spec.selector"));
  return problems;
}

// The Pod Security Standards level (restricted, baseline or privileged) the pods of a workload
// need, from the fields the chart can set: what `baseline` refuses (host namespaces, privileged
// containers, added capabilities beyond its list, hostPath volumes, host ports, unconfined
// seccomp) needs `privileged`; what only `restricted` refuses needs `baseline`.
const BASELINE_CAPABILITIES = new Set(["AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID",
  "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"]);
const RESTRICTED_VOLUMES = ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
  "persistentVolumeClaim", "projected", "secret"];
const LEVELS = ["restricted", "baseline", "privileged"];

function podSecurity(pod) {
  const privileged = [];
  const baseline = [];
  if (pod.hostNetwork) privileged.push("hostNetwork");
  if (pod.hostIPC) privileged.push("hostIPC");
  if (pod.hostPID) privileged.push("hostPID");
  const podSeccomp = pod.securityContext?.seccompProfile?.type;
  if (podSeccomp === "Unconfined") privileged.push("pod seccompProfile Unconfined");
  for (const volume of pod.volumes ?? []) {
    if (volume.hostPath) privileged.push(`hostPath volume ${volume.name}`);
    if (!RESTRICTED_VOLUMES.some((type) => type in volume)) baseline.push(`volume ${volume.name}`);
  }
  const podNonRoot = pod.securityContext?.runAsNonRoot === true;
  if (pod.securityContext?.runAsUser === 0) baseline.push("pod runAsUser 0");
  for (const container of [...(pod.initContainers ?? []), ...(pod.containers ?? [])]) {
    const context = container.securityContext ?? {};
    const name = `container ${container.name}`;
    if (context.privileged) privileged.push(`${name} privileged`);
    const added = context.capabilities?.add ?? [];
    for (const capability of added) {
      if (!BASELINE_CAPABILITIES.has(capability)) privileged.push(`${name} adds ${capability}`);
      else if (capability !== "NET_BIND_SERVICE") baseline.push(`${name} adds ${capability}`);
    }
    if ((container.ports ?? []).some((port) => port.hostPort)) privileged.push(`${name} hostPort`);
    const seccomp = context.seccompProfile?.type ?? podSeccomp;
    if (context.seccompProfile?.type === "Unconfined") privileged.push(`${name} seccomp Unconfined`);
    if (seccomp !== "RuntimeDefault" && seccomp !== "Localhost") baseline.push(`${name} seccomp`);
    if (context.allowPrivilegeEscalation !== false) baseline.push(`${name} allowPrivilegeEscalation`);
    if (!(context.runAsNonRoot ?? podNonRoot)) baseline.push(`${name} runAsNonRoot`);
    if (context.runAsUser === 0) baseline.push(`${name} runAsUser 0`);
    if (!(context.capabilities?.drop ?? []).includes("ALL")) baseline.push(`${name} drops not ALL`);
  }
  if (privileged.length) return { level: "privileged", why: privileged };
  if (baseline.length) return { level: "baseline", why: baseline };
  return { level: "restricted", why: [] };
}

// The level the rendered workloads need together: the highest of any pod template's.
function podSecurityOfManifests(file) {
  let needed = { level: "restricted", why: [] };
  for (const document of YAML.parseAllDocuments(fs.readFileSync(file, "utf8"))) {
    const object = document.toJS();
    const pod = object?.spec?.template?.spec;
    if (!pod) continue;
    const result = podSecurity(pod);
    if (LEVELS.indexOf(result.level) > LEVELS.indexOf(needed.level)) {
      needed = { level: result.level, why: [] };
    }
    if (result.level === needed.level) {
      needed.why.push(...result.why.map((why) => `${object.kind}/${object.metadata.name}: ${why}`));
    }
  }
  return needed;
}

function validateManifests(file) {
  const problems = [];
  let count = 0;
  for (const document of YAML.parseAllDocuments(fs.readFileSync(file, "utf8"))) {
    const object = document.toJS();
    if (object === null) continue;
    count++;
    const name = `${object.kind}/${object.metadata?.name}`;
    const module = MODEL_MODULES[object.apiVersion];
    const Model = module && npm(module)[object.kind];
    if (!Model) {
      problems.push(`${file}: ${name}: no schema for ${object.apiVersion} ${object.kind}`);
      continue;
    }
    try {
      new Model(object).validate();
    } catch (error) {
      problems.push(`${file}: ${name}: ${error.message}`);
    }
    for (const problem of [...validateName(object), ...validateLabels(object)]) {
      problems.push(`${file}: ${name}: ${problem}`);
    }
  }
  if (count === 0) problems.push(`${file}: no objects`);
  return { problems, count };
}

function main([mode, ...args]) {
  let problems;
  if (mode === "values") {
    problems = validateValues(args[0], args.slice(1));
  } else if (mode === "manifests") {
    const result = validateManifests(args[0]);
    problems = result.problems;
    if (!problems.length) console.log(`${args[0]}: ${result.count} objects valid`);
  } else if (mode === "podsecurity") {
    // Prints the level, then (on stderr) what needs it.
    const result = podSecurityOfManifests(args[0]);
    console.log(result.level);
    for (const why of result.why) console.error(`  ${why}`);
    problems = [];
  } else {
    console.error(
        "usage: validate.cjs values CHART_DIR [FILE...] | manifests RENDERED.yaml | podsecurity RENDERED.yaml");
    return 2;
  }
  for (const problem of problems) console.error(problem);
  return problems.length ? 1 : 0;
}

process.exitCode = main(process.argv.slice(2));
