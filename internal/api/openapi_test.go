package api

import (
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/airlock-sandbox/airlock/internal/store"
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

// TestServeOpenAPI: GET /v1/openapi.yaml serves api/openapi.yaml as it is
// on disk, without a key, as the spec documents it; If-None-Match with its
// ETag is 304.
func TestServeOpenAPI(t *testing.T) {
	t.Parallel()
	want, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, store.APIKey{})
	r := h.do("", "GET", "/v1/openapi.yaml", nil)
	if r.code != 200 || string(r.body) != string(want) {
		t.Fatalf("GET /v1/openapi.yaml: %d, %d bytes (want 200, the %d bytes of api/openapi.yaml)", r.code, len(r.body), len(want))
	}
	if ct := r.hdr.Get("Content-Type"); ct != "application/yaml" {
		t.Errorf("Content-Type %q", ct)
	}
	etag := r.hdr.Get("ETag")
	if !strings.HasPrefix(etag, `"`) {
		t.Fatalf("ETag %q", etag)
	}
	req, err := http.NewRequestWithContext(t.Context(), "GET", h.url+"/v1/openapi.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("If-None-Match", etag)
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotModified {
		t.Errorf("If-None-Match: %d, want 304", res.StatusCode)
	}
}
