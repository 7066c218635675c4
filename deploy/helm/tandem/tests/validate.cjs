// Validates what the chart takes and what it renders, as `helm install` and the API server
// would, with the npm packages in tools/npm (run tools/setup first):
//   node validate.cjs values CHART_DIR [VALUES_FILE...]  merged values against values.schema.json
//   node validate.cjs manifests RENDERED.yaml             every object against its OpenAPI schema
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

function validateName(object) {
  const name = object.metadata?.name ?? "";
  const limit = NAME_LIMITS[object.kind] ?? 253;
  return name.length <= limit ? null : `name has ${name.length} characters; ${object.kind} allows ${limit}`;
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
    const badName = validateName(object);
    if (badName) problems.push(`${file}: ${name}: ${badName}`);
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
  } else {
    console.error("usage: validate.cjs values CHART_DIR [FILE...] | manifests RENDERED.yaml");
    return 2;
  }
  for (const problem of problems) console.error(problem);
  return problems.length ? 1 : 0;
}

process.exitCode = main(process.argv.slice(2));
