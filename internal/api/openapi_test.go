package api

import (
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestOpenAPIMatchesRoutes keeps api/openapi.yaml and the route table in
// step: the same set of (method, path).
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		OpenAPI string                    `yaml:"openapi"`
		Paths   map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(spec.OpenAPI, "3.0") {
		t.Fatalf("openapi %q", spec.OpenAPI)
	}
	inSpec := map[string]bool{}
	for p, ops := range spec.Paths {
		for m, op := range ops {
			if m == "parameters" || m == "summary" || m == "description" {
				continue
			}
			if o, _ := op.(map[string]any); o["responses"] == nil {
				t.Errorf("%s %s has no responses", m, p)
			}
			inSpec[strings.ToUpper(m)+" "+p] = true
		}
	}
	// A route for all methods ("/path") stands for every method the spec
	// lists under its path and must list at least one; "{x...}" is "{x}".
	inMux := map[string]bool{}
	for _, r := range routes {
		pattern := strings.ReplaceAll(r.pattern, "...}", "}")
		if strings.HasPrefix(pattern, "/") {
			n := 0
			for k := range inSpec {
				if _, p, _ := strings.Cut(k, " "); p == pattern {
					inMux[k] = true
					n++
				}
			}
			if n == 0 {
				t.Errorf("route %s (all methods) is not in api/openapi.yaml", r.pattern)
			}
			continue
		}
		inMux[pattern] = true
	}
	for k := range inMux {
		if !inSpec[k] {
			t.Errorf("route %s is not in api/openapi.yaml", k)
		}
	}
	for k := range inSpec {
		if !inMux[k] {
			t.Errorf("api/openapi.yaml has %s, which the server does not serve", k)
		}
	}
	if t.Failed() {
		t.Logf("spec: %v", slices.Sorted(maps.Keys(inSpec)))
	}
}
