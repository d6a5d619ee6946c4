// Package apispec checks HTTP responses against api/openapi.yaml: the
// status must be one the operation documents (or an error every route can
// give), and a JSON body must match the documented schema, where every
// object is closed (a field the server sends must be in the spec). The API
// tests (on the fake) and the e2e tests (on the real server) run every
// response through it, so the spec cannot drift from the server.
package apispec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/google/jsonschema-go/jsonschema"
	"gopkg.in/yaml.v3"
)

type specOp struct {
	method string
	path   *regexp.Regexp
	name   string
	resp   map[string]map[string]*jsonschema.Resolved // status -> media type -> schema
}

var (
	specOnce sync.Once
	specOps  []specOp
	specErr  error
)

// genericStatuses are errors any authenticated route can answer.
var genericStatuses = []string{"400", "401", "404", "413", "429", "500", "503", "507"}

// specFile finds api/openapi.yaml from a test's working directory (a
// package directory of this module).
func specFile() string {
	dir, _ := os.Getwd()
	for range 6 {
		p := filepath.Join(dir, "api", "openapi.yaml")
		if _, err := os.Stat(p); err == nil {
			return p
		}
		dir = filepath.Dir(dir)
	}
	return filepath.Join("api", "openapi.yaml")
}

func loadSpec() ([]specOp, error) {
	specOnce.Do(func() { specOps, specErr = parseSpec(specFile()) })
	return specOps, specErr
}

func parseSpec(file string) ([]specOp, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	comps, _ := doc["components"].(map[string]any)
	defs := map[string]any{}
	if s, ok := comps["schemas"].(map[string]any); ok {
		for k, v := range s {
			defs[k] = toJSONSchema(v)
		}
	}
	// allOf of closed objects can never match: merge each into one object.
	for k, v := range defs {
		defs[k] = mergeAllOf(v, defs)
	}
	responses, _ := comps["responses"].(map[string]any)
	var ops []specOp
	paths, _ := doc["paths"].(map[string]any)
	for p, v := range paths {
		methods, _ := v.(map[string]any)
		// {path} (the preview route's rest of the path) matches anything,
		// other parameters one segment.
		re := regexp.MustCompile("^" + regexp.MustCompile(`\\\{[a-z_]+\\\}`).ReplaceAllStringFunc(regexp.QuoteMeta(p), func(m string) string {
			if m == `\{path\}` {
				return ".*"
			}
			return "[^/]+"
		}) + "$")
		for m, o := range methods {
			op, ok := o.(map[string]any)
			if !ok || m == "parameters" {
				continue
			}
			so := specOp{method: strings.ToUpper(m), path: re, name: strings.ToUpper(m) + " " + p, resp: map[string]map[string]*jsonschema.Resolved{}}
			rs, _ := op["responses"].(map[string]any)
			for status, r := range rs {
				rm, _ := r.(map[string]any)
				if ref, ok := rm["$ref"].(string); ok {
					rm, _ = responses[strings.TrimPrefix(ref, "#/components/responses/")].(map[string]any)
				}
				so.resp[status] = map[string]*jsonschema.Resolved{}
				content, _ := rm["content"].(map[string]any)
				for mt, c := range content {
					cm, _ := c.(map[string]any)
					sch, ok := cm["schema"]
					if !ok || !strings.Contains(mt, "json") {
						so.resp[status][mt] = nil // documented; only JSON bodies are checked
						continue
					}
					root := toJSONSchema(sch).(map[string]any)
					root["$defs"] = defs
					raw, _ := json.Marshal(root)
					var s jsonschema.Schema
					if err := json.Unmarshal(raw, &s); err != nil {
						return nil, fmt.Errorf("%s %s %s: %w", so.name, status, mt, err)
					}
					res, err := s.Resolve(nil)
					if err != nil {
						return nil, fmt.Errorf("%s %s %s: %w", so.name, status, mt, err)
					}
					so.resp[status][mt] = res
				}
			}
			ops = append(ops, so)
		}
	}
	return ops, nil
}

// toJSONSchema turns an OpenAPI 3.0 schema into JSON Schema: refs to
// components point into $defs, nullable becomes a "null" type, and objects
// with properties are closed unless they say otherwise.
func toJSONSchema(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			switch k {
			case "$ref":
				out[k] = strings.Replace(e.(string), "#/components/schemas/", "#/$defs/", 1)
			case "nullable", "example", "discriminator":
			default:
				out[k] = toJSONSchema(e)
			}
		}
		if x["nullable"] == true {
			if t, ok := out["type"].(string); ok {
				out["type"] = []any{t, "null"}
			} else if _, ok := out["oneOf"]; ok {
				out["oneOf"] = append(out["oneOf"].([]any), map[string]any{"type": "null"})
			}
		}
		if _, ok := out["properties"]; ok {
			if _, set := out["additionalProperties"]; !set {
				out["additionalProperties"] = false
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = toJSONSchema(e)
		}
		return out
	}
	return v
}

// mergeAllOf turns {allOf: [objects or refs to them]} into one object
// with their properties and required fields.
func mergeAllOf(v any, defs map[string]any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	parts, ok := m["allOf"].([]any)
	if !ok {
		return v
	}
	props, required := map[string]any{}, []any{}
	for _, p := range parts {
		pm, _ := p.(map[string]any)
		if ref, ok := pm["$ref"].(string); ok {
			pm, _ = mergeAllOf(defs[strings.TrimPrefix(ref, "#/$defs/")], defs).(map[string]any)
		}
		if pp, ok := pm["properties"].(map[string]any); ok {
			for k, x := range pp {
				props[k] = x
			}
		}
		if r, ok := pm["required"].([]any); ok {
			required = append(required, r...)
		}
	}
	out := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		out["required"] = required
	}
	return out
}

// Check reports how a response departs from the spec, or nil.
func Check(method, path string, status int, ctype string, body []byte) error {
	ops, err := loadSpec()
	if err != nil {
		return fmt.Errorf("api/openapi.yaml: %w", err)
	}
	path, _, _ = strings.Cut(path, "?")
	var op *specOp
	for i := range ops {
		if ops[i].method == method && ops[i].path.MatchString(path) {
			if op == nil || len(ops[i].path.String()) > len(op.path.String()) {
				op = &ops[i]
			}
		}
	}
	st := strconv.Itoa(status)
	var media map[string]*jsonschema.Resolved
	switch {
	case op == nil && status == http.StatusNotFound:
		op, media = &specOp{name: method + " " + path}, errorMedia(ops) // no such route
	case op == nil:
		return fmt.Errorf("%s %s is not in the spec", method, path)
	default:
		var ok bool
		if media, ok = op.resp[st]; !ok {
			if d, ok := op.resp["default"]; ok {
				media = d // any status (the preview route passes the guest's on)
				break
			}
			if !isGeneric(st) {
				return fmt.Errorf("%s: status %d is not documented", op.name, status)
			}
			media = errorMedia(ops)
		}
	}
	mt, _, _ := strings.Cut(ctype, ";")
	if len(media) == 0 {
		return nil // a status without a body schema
	}
	sch, ok := media[mt]
	if ok && sch == nil || !ok && mt != "" && !strings.Contains(mt, "json") && hasMedia(media, mt) {
		return nil // documented, not JSON: no schema to check
	}
	if !ok {
		if status == http.StatusNoContent || len(body) == 0 && mt == "" {
			return nil
		}
		return fmt.Errorf("%s %d: content type %q is not documented", op.name, status, ctype)
	}
	if mt == "application/x-ndjson" {
		for _, line := range bytes.Split(bytes.TrimSpace(body), []byte("\n")) {
			if err := validateJSON(sch, line); err != nil {
				return fmt.Errorf("%s %d: %w (line %.120s)", op.name, status, err, line)
			}
		}
		return nil
	}
	if err := validateJSON(sch, body); err != nil {
		return fmt.Errorf("%s %d: %w (body %.120s)", op.name, status, err, body)
	}
	return nil
}

func isGeneric(status string) bool {
	for _, s := range genericStatuses {
		if s == status {
			return true
		}
	}
	return false
}

// hasMedia reports whether media documents mt (possibly without a schema).
func hasMedia(media map[string]*jsonschema.Resolved, mt string) bool {
	_, ok := media[mt]
	return ok
}

// errorMedia is the Error response's schema (any operation's).
func errorMedia(ops []specOp) map[string]*jsonschema.Resolved {
	for _, o := range ops {
		if m, ok := o.resp["404"]; ok && m["application/json"] != nil {
			return m
		}
	}
	return nil
}

func validateJSON(sch *jsonschema.Resolved, b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return sch.Validate(v)
}
