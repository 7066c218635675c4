// helm_render renders a Helm v3 chart offline the way `helm template` does: Go text/template
// with sprig and Helm's own functions (include, tpl, required, toYaml, fromYaml, lookup, ...),
// values from values.yaml, then each -f file, then each --set, and the built-in objects
// .Release, .Chart, .Capabilities, .Files and .Template. No helm binary can be installed here;
// the chart's templates keep to what Helm renders identically. One deliberate difference:
// sprig's random functions draw from a fixed seed, so golden renders are reproducible.
//
//	helm_render --chart=deploy/helm/tandem [-f values.yaml]... [--set a.b=c]... [--notes]
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	yamlv2 "gopkg.in/yaml.v2"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	chartDir := flag.String("chart", "", "chart directory")
	releaseName := flag.String("release", "tandem", "release name")
	namespace := flag.String("namespace", "default", "release namespace")
	notes := flag.Bool("notes", false, "print the rendered NOTES.txt instead of the manifests")
	var valueFiles, sets listFlag
	flag.Var(&valueFiles, "f", "values file (repeatable; later ones win)")
	flag.Var(&sets, "set", "path=value (repeatable; wins over files)")
	flag.Parse()
	out, err := render(*chartDir, *releaseName, *namespace, valueFiles, sets, *notes)
	if err != nil {
		fmt.Fprintf(os.Stderr, "helm_render: %v\n", err)
		os.Exit(1)
	}
	os.Stdout.WriteString(out)
}

func render(chartDir, releaseName, namespace string, valueFiles, sets []string, notes bool) (string, error) {
	chart, err := readYAMLFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return "", err
	}
	values, err := readYAMLFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		return "", err
	}
	for _, file := range valueFiles {
		overrides, err := readYAMLFile(file)
		if err != nil {
			return "", err
		}
		values = mergeValues(values, overrides)
	}
	for _, set := range sets {
		if err := setValue(values, set); err != nil {
			return "", err
		}
	}
	files, templates, err := readChartFiles(chartDir)
	if err != nil {
		return "", err
	}
	chartName := fmt.Sprint(chart["name"])
	top := map[string]interface{}{
		"Values": values,
		"Chart":  chartObject(chart),
		"Release": map[string]interface{}{
			"Name": releaseName, "Namespace": namespace, "Service": "Helm",
			"IsInstall": true, "IsUpgrade": false, "Revision": 1,
		},
		"Capabilities": map[string]interface{}{
			"KubeVersion": map[string]interface{}{"Version": "v1.30.0", "Major": "1", "Minor": "30"},
			"APIVersions": apiVersions{},
			"HelmVersion": map[string]interface{}{"Version": "v3.15.0"},
		},
		"Files": chartFiles(files),
	}
	return execute(chartName, templates, top, notes)
}

// Helm's Chart object: Chart.yaml's fields, capitalised.
func chartObject(chart map[string]interface{}) map[string]interface{} {
	object := map[string]interface{}{}
	for key, value := range chart {
		object[strings.ToUpper(key[:1])+key[1:]] = value
	}
	return object
}

// Every API version is available: the chart must not depend on the cluster it is rendered for.
type apiVersions struct{}

func (apiVersions) Has(string) bool { return true }

type chartFiles map[string][]byte

func (f chartFiles) Get(name string) string { return string(f[name]) }

// Glob returns the files matching pattern, as Helm's .Files.Glob (ranged over as path => file).
func (f chartFiles) Glob(pattern string) map[string]string {
	matched := map[string]string{}
	for name, content := range f {
		if ok, _ := path.Match(pattern, name); ok {
			matched[name] = string(content)
		}
	}
	return matched
}

// The chart's files: templates/ (by their Helm name "<chart>/templates/x") and every other
// file for .Files, minus Chart.yaml, values files and what .helmignore excludes (directories).
func readChartFiles(chartDir string) (chartFiles, map[string]string, error) {
	ignored := ignoredDirs(chartDir)
	files := chartFiles{}
	templates := map[string]string{}
	err := filepath.Walk(chartDir, func(file string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(chartDir, file)
		if info.IsDir() {
			if ignored[rel+"/"] {
				return filepath.SkipDir
			}
			return nil
		}
		content, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		if strings.HasPrefix(rel, "templates/") {
			templates[rel] = string(content)
		} else {
			files[rel] = content
		}
		return nil
	})
	return files, templates, err
}

func ignoredDirs(chartDir string) map[string]bool {
	ignored := map[string]bool{}
	content, _ := os.ReadFile(filepath.Join(chartDir, ".helmignore"))
	for _, line := range strings.Split(string(content), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasSuffix(line, "/") && !strings.HasPrefix(line, "#") {
			ignored[line] = true
		}
	}
	return ignored
}

func execute(chartName string, templates map[string]string, top map[string]interface{}, notes bool) (string, error) {
	root := template.New("chart")
	root.Option("missingkey=zero")
	root.Funcs(funcMap(root, top))
	names := make([]string, 0, len(templates))
	for name := range templates {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		full := chartName + "/" + name
		if _, err := root.New(full).Parse(templates[name]); err != nil {
			return "", err
		}
	}
	var out strings.Builder
	for _, name := range names {
		base := path.Base(name)
		isNotes := base == "NOTES.txt"
		if strings.HasPrefix(base, "_") || isNotes != notes {
			continue
		}
		full := chartName + "/" + name
		top["Template"] = map[string]interface{}{"Name": full, "BasePath": chartName + "/templates"}
		var rendered bytes.Buffer
		if err := root.ExecuteTemplate(&rendered, full, top); err != nil {
			return "", err
		}
		text := strings.ReplaceAll(rendered.String(), "<no value>", "")
		if notes {
			out.WriteString(text)
			continue
		}
		writeManifests(&out, full, text)
	}
	return out.String(), nil
}

// Each non-empty YAML document of a template, headed as `helm template` heads it.
func writeManifests(out *strings.Builder, source, text string) {
	for _, document := range regexp.MustCompile(`(?m)^---\s*$`).Split(text, -1) {
		if strings.TrimSpace(stripComments(document)) == "" {
			continue
		}
		fmt.Fprintf(out, "---\n# Source: %s\n%s\n", source, strings.Trim(document, "\n"))
	}
}

func stripComments(document string) string {
	var kept []string
	for _, line := range strings.Split(document, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "\n")
}

func funcMap(root *template.Template, top map[string]interface{}) template.FuncMap {
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env") // Helm removes these: a render must not depend on the environment.
	delete(funcs, "expandenv")
	seeded := rand.New(rand.NewSource(1))
	const alphaNum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	funcs["randAlphaNum"] = func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = alphaNum[seeded.Intn(len(alphaNum))]
		}
		return string(b)
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		err := root.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := root.Clone()
		if err != nil {
			return "", err
		}
		if _, err := t.New("tpl").Parse(text); err != nil {
			return "", err
		}
		var buf bytes.Buffer
		err = t.ExecuteTemplate(&buf, "tpl", data)
		return strings.ReplaceAll(buf.String(), "<no value>", ""), err
	}
	funcs["required"] = func(message string, value interface{}) (interface{}, error) {
		if value == nil || value == "" {
			return nil, errors.New(message)
		}
		return value, nil
	}
	funcs["fail"] = func(message string) (string, error) { return "", errors.New(message) }
	funcs["lookup"] = func(string, string, string, string) map[string]interface{} {
		return map[string]interface{}{} // As `helm template`: no cluster to look in.
	}
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = func(text string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := unmarshalLikeHelm([]byte(text), &m); err != nil {
			return map[string]interface{}{"Error": err.Error()}
		}
		return m
	}
	funcs["fromYamlArray"] = func(text string) []interface{} {
		var a []interface{}
		if err := unmarshalLikeHelm([]byte(text), &a); err != nil {
			return []interface{}{err.Error()}
		}
		return a
	}
	funcs["toJson"] = func(v interface{}) string {
		data, _ := json.Marshal(v)
		return string(data)
	}
	funcs["fromJson"] = func(text string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := json.Unmarshal([]byte(text), &m); err != nil {
			return map[string]interface{}{"Error": err.Error()}
		}
		return m
	}
	return funcs
}

// toYAML is Helm's toYaml: sigs.k8s.io/yaml (JSON, then yaml.v2), without the final newline.
func toYAML(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	out, err := yamlv2.Marshal(jsonOrder(data))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(out), "\n")
}

// jsonOrder decodes JSON into yaml.v2 values (maps sorted by key, as sigs.k8s.io/yaml writes).
func jsonOrder(data []byte) interface{} {
	var generic interface{}
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.UseNumber()
	if err := decoder.Decode(&generic); err != nil {
		return nil
	}
	return toYAMLValue(generic)
}

func toYAMLValue(v interface{}) interface{} {
	switch value := v.(type) {
	case map[string]interface{}:
		keys := make([]string, 0, len(value))
		for key := range value {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		slice := yamlv2.MapSlice{}
		for _, key := range keys {
			slice = append(slice, yamlv2.MapItem{Key: key, Value: toYAMLValue(value[key])})
		}
		return slice
	case []interface{}:
		for i := range value {
			value[i] = toYAMLValue(value[i])
		}
		return value
	case json.Number:
		if i, err := value.Int64(); err == nil {
			return i
		}
		f, _ := value.Float64()
		return f
	}
	return v
}

// unmarshalLikeHelm reads YAML as sigs.k8s.io/yaml does: through JSON, so numbers are float64
// and maps are map[string]interface{}.
func unmarshalLikeHelm(data []byte, out interface{}) error {
	var generic interface{}
	if err := yamlv2.Unmarshal(data, &generic); err != nil {
		return err
	}
	converted, err := jsonCompatible(generic)
	if err != nil {
		return err
	}
	asJSON, err := json.Marshal(converted)
	if err != nil {
		return err
	}
	return json.Unmarshal(asJSON, out)
}

func jsonCompatible(v interface{}) (interface{}, error) {
	switch value := v.(type) {
	case map[interface{}]interface{}:
		m := map[string]interface{}{}
		for key, item := range value {
			converted, err := jsonCompatible(item)
			if err != nil {
				return nil, err
			}
			m[fmt.Sprint(key)] = converted
		}
		return m, nil
	case []interface{}:
		for i := range value {
			converted, err := jsonCompatible(value[i])
			if err != nil {
				return nil, err
			}
			value[i] = converted
		}
		return value, nil
	}
	return v, nil
}

func readYAMLFile(file string) (map[string]interface{}, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	m := map[string]interface{}{}
	if err := unmarshalLikeHelm(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	return m, nil
}

// mergeValues overlays `overrides` on `base` as Helm coalesces values: maps merge key by key,
// anything else is replaced; a null removes the key.
func mergeValues(base, overrides map[string]interface{}) map[string]interface{} {
	for key, value := range overrides {
		if value == nil {
			delete(base, key)
			continue
		}
		baseMap, baseIsMap := base[key].(map[string]interface{})
		overMap, overIsMap := value.(map[string]interface{})
		if baseIsMap && overIsMap {
			base[key] = mergeValues(baseMap, overMap)
		} else {
			base[key] = value
		}
	}
	return base
}

// setValue applies one --set path=value: numbers, true/false and null are typed, as Helm's
// --set types them; anything else is a string.
func setValue(values map[string]interface{}, assignment string) error {
	eq := strings.Index(assignment, "=")
	if eq <= 0 {
		return fmt.Errorf("--set %q: want path=value", assignment)
	}
	keys := strings.Split(assignment[:eq], ".")
	raw := assignment[eq+1:]
	var value interface{} = raw
	if i, err := strconv.ParseInt(raw, 10, 64); err == nil {
		value = i
	} else if raw == "true" || raw == "false" {
		value = raw == "true"
	} else if raw == "null" {
		value = nil
	}
	node := values
	for _, key := range keys[:len(keys)-1] {
		child, ok := node[key].(map[string]interface{})
		if !ok {
			child = map[string]interface{}{}
			node[key] = child
		}
		node = child
	}
	node[keys[len(keys)-1]] = value
	return nil
}
