package sandbox

import "testing"

// Which FROM arguments are registry references, and which a caller may
// pull: the local user any, an API key those the server allows.
func TestRegistryRef(t *testing.T) {
	t.Parallel()
	m := &Manager{TemplateRegistries: []string{NormalizeRegistry("docker.io"), "ghcr.io", "127.0.0.1:5000"}}
	key := Caller{Tenant: "alice", KeyID: "k1", Via: "api"}
	for _, tc := range []struct {
		from     string
		caller   Caller
		registry string
		allowed  bool
	}{
		{"base", key, "", false},     // a bare name is a local image, never Docker Hub's
		{"base", Local(), "", false}, // likewise for the local user
		{"python:3.12", key, "index.docker.io", true},
		{"docker.io/library/python:3.12", key, "index.docker.io", true},
		{"ghcr.io/org/app@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", key, "ghcr.io", true},
		{"127.0.0.1:5000/tiny:1", key, "127.0.0.1:5000", true},
		{"127.0.0.1:5001/tiny:1", key, "127.0.0.1:5001", false},
		{"quay.io/org/app:1", key, "quay.io", false},
		{"quay.io/org/app:1", Local(), "quay.io", true},
		{"UPPER/Case:1", key, "", false}, // not a reference
	} {
		_, registry, allowed := m.registryRef(tc.caller, tc.from)
		if registry != tc.registry || allowed != tc.allowed {
			t.Errorf("%s (local %v): registry %q allowed %v, want %q %v", tc.from, tc.caller.Local(), registry, allowed, tc.registry, tc.allowed)
		}
	}
}
