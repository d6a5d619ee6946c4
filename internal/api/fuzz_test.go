package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// jsonRoutes are the routes that read a JSON body.
var jsonRoutes = func() []string {
	var out []string
	for _, rt := range routes {
		if strings.HasPrefix(rt.pattern, "POST ") {
			out = append(out, rt.pattern)
		}
	}
	return out
}()

// FuzzAPIBodies sends arbitrary bodies to every POST route as a tenant:
// the answer is never a 500 and every refusal is the API's JSON error.
func FuzzAPIBodies(f *testing.F) {
	h := newHarness(f, store.APIKey{})
	seeds := []string{
		`{}`, `{"cmd":["echo","hi"]}`, `{"cmd":["sh"],"stdin":"x","background":true}`,
		`{"code":"1+1"}`, `{"language":"python"}`, `{"path":"/tmp/x","parents":true}`,
		`{"cpus":1,"memory_mb":256}`, `{"timeout_s":60}`, `{"name":"s1"}`, `{"count":2}`,
		`{"signal":"SIGTERM"}`, `{"data":"aGk="}`, `[]`, `null`, `{`, `{"cmd":[""]}`,
		`{"cmd":["x"],"env":{"A":"\u0000"}}`, `{"timeout_s":-1}`, `{"cmd":["x"],"timeout_s":1e99}`,
	}
	for i := range jsonRoutes {
		for _, s := range seeds {
			f.Add(uint8(i), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		pattern := jsonRoutes[int(route)%len(jsonRoutes)]
		method, path := concrete(pattern, "aliceaaaaaaa")
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, h.url+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+h.alice)
		res, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s %q: %v", pattern, body, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		if res.StatusCode >= 500 {
			t.Fatalf("%s %q: %d %s", pattern, body, res.StatusCode, b)
		}
		if res.StatusCode >= 400 {
			var e struct {
				Error struct{ Code, Message string }
			}
			if err := json.Unmarshal(b, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
				t.Fatalf("%s %q: %d with a body that is not the API's error: %q", pattern, body, res.StatusCode, b)
			}
		}
	})
}
