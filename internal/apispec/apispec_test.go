package apispec

import (
	"strings"
	"testing"
)

// TestSchemaCheckCatchesDrift: the check refuses what the spec does not
// say (so its silence elsewhere means something).
func TestSchemaCheckCatchesDrift(t *testing.T) {
	const sb = `{"id":"aaaaaaaaaaaa","state":"running","reason":"","image":"base","image_digest":"","cpus":1,"memory_mb":512,"disk_mb":2048,` +
		`"created_at":"2026-01-01T00:00:00Z","expires_at":"2026-01-01T00:00:00Z","accel":"tcg","guest_kernel":"","start_mode":"","runtime":"qemu",` +
		`"metadata":{},"tenant":"a","network":{},"idle_pause_s":0,"source":"","disk_usage_bytes":1}`
	if err := Check("GET", "/v1/sandboxes/aaaaaaaaaaaa", 200, "application/json", []byte(sb)); err != nil {
		t.Fatalf("a valid sandbox: %v", err)
	}
	for _, c := range []struct {
		method, path string
		status       int
		body         string
	}{
		{"GET", "/v1/sandboxes/aaaaaaaaaaaa", 200, strings.Replace(sb, `"cpus":1`, `"cpus":1,"undocumented":true`, 1)},
		{"GET", "/v1/sandboxes/aaaaaaaaaaaa", 200, strings.Replace(sb, `"cpus":1`, `"cpus":"1"`, 1)},
		{"GET", "/v1/sandboxes/aaaaaaaaaaaa", 200, strings.Replace(sb, `"state":"running"`, `"state":"sleeping"`, 1)},
		{"GET", "/v1/sandboxes/aaaaaaaaaaaa", 418, `{}`},
		{"GET", "/v1/sandboxes/aaaaaaaaaaaa", 404, `{"error":{"code":"gone","message":"x","request_id":"r"}}`},
		{"POST", "/v1/sandboxes/aaaaaaaaaaaa/exec", 200, `{"type":"exit","code":"zero"}`},
	} {
		if err := Check(c.method, c.path, c.status, "application/json", []byte(c.body)); err == nil {
			t.Errorf("%s %s %d %s passed the check", c.method, c.path, c.status, c.body)
		}
	}
}
