package e2b

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// TestCreateWithVolumeMounts: volumeMounts map to read-write volumes, and
// get and list report them; a volume mounted elsewhere or missing is a
// clear 4xx.
func TestCreateWithVolumeMounts(t *testing.T) {
	h := newHarness(t)
	r := h.do(h.alice, "POST", "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"data","path":"/data"},{"name":"models","path":"/models"}]}`)
	if r.code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	var sb Sandbox
	r.json(t, &sb)
	o := h.fake.created[len(h.fake.created)-1]
	if want := []sandbox.VolumeMount{{Name: "data", Path: "/data"}, {Name: "models", Path: "/models"}}; fmt.Sprint(o.Volumes) != fmt.Sprint(want) {
		t.Fatalf("volumes: %+v", o.Volumes)
	}
	want := `"volumeMounts":[{"name":"data","path":"/data"},{"name":"models","path":"/models"}]`
	if r := h.do(h.alice, "GET", "/sandboxes/"+sb.SandboxID, ""); r.code != 200 || !strings.Contains(string(r.body), want) {
		t.Fatalf("get: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "GET", "/v2/sandboxes", ""); r.code != 200 || !strings.Contains(string(r.body), want) {
		t.Fatalf("list: %d %s", r.code, r.body)
	}
	for body, wantErr := range map[string]struct {
		code int
		msg  string
	}{
		`{"volumeMounts":[{"name":"busy","path":"/data"}]}`:    {http.StatusConflict, "read-write by one sandbox"},
		`{"volumeMounts":[{"name":"missing","path":"/data"}]}`: {http.StatusNotFound, "a volume of volumeMounts not found"},
	} {
		r := h.do(h.alice, "POST", "/v2/sandboxes", body)
		if r.code != wantErr.code || !strings.Contains(string(r.body), wantErr.msg) {
			t.Errorf("%s: %d %s", body, r.code, r.body)
		}
	}
	// Without volumes a sandbox reports an empty list, never null.
	r = h.do(h.alice, "POST", "/v2/sandboxes", `{}`)
	r.json(t, &sb)
	if r := h.do(h.alice, "GET", "/sandboxes/"+sb.SandboxID, ""); !strings.Contains(string(r.body), `"volumeMounts":[]`) {
		t.Fatalf("no volumes: %s", r.body)
	}
}
