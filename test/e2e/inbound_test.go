package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestInboundOnRecord: connections to a published port and requests
// through the preview route are net.inbound events in the audit trail,
// with the guest port, the client's address, bytes each way and the way
// in; a refused preview (nothing listening) is recorded as refused.
func TestInboundOnRecord(t *testing.T) {
	e := setup(t)
	key := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-inbound", "--admin"))
	s := startServe(t, e)
	code, b := s.do(key, "POST", "/v1/sandboxes", strings.NewReader(`{"timeout_s":600,"network":{"ports":[{"host_ip":"127.0.0.1","host_port":0,"guest_port":8000}]}}`))
	if code != 201 {
		t.Fatalf("create: %d %s", code, b)
	}
	var sb struct {
		ID      string
		Network struct {
			Ports []struct {
				HostPort int `json:"host_port"`
			} `json:"ports"`
		} `json:"network"`
	}
	_ = json.Unmarshal(b, &sb)
	t.Cleanup(func() { s.do(key, "DELETE", "/v1/sandboxes/"+sb.ID, nil) })
	code, b = s.do(key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", strings.NewReader(`{"cmd":["sh","-c","cd /etc && setsid python3 -m http.server 8000 >/dev/null 2>&1 </dev/null & for i in $(seq 50); do python3 -c 'import socket;socket.create_connection((\"127.0.0.1\",8000))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1"]}`))
	if code != 200 || !strings.Contains(string(b), `"code":0`) {
		t.Fatalf("start a guest web server: %d %s", code, b)
	}
	if code, b = s.do(key, "GET", "/v1/sandboxes/"+sb.ID, nil); code != 200 {
		t.Fatalf("get: %d %s", code, b)
	}
	_ = json.Unmarshal(b, &sb)
	if len(sb.Network.Ports) != 1 || sb.Network.Ports[0].HostPort == 0 {
		t.Fatalf("ports: %s", b)
	}
	const published = 3
	for range published {
		res, err := (&http.Client{Timeout: 30 * time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/hostname", sb.Network.Ports[0].HostPort))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(body) != "airlock\n" {
			t.Fatalf("published port: %d %q", res.StatusCode, body)
		}
	}
	if code, b := s.do(key, "GET", "/v1/sandboxes/"+sb.ID+"/ports/8000/hostname", nil); code != 200 || string(b) != "airlock\n" {
		t.Fatalf("preview: %d %q", code, b)
	}
	if code, _ := s.do(key, "GET", "/v1/sandboxes/"+sb.ID+"/ports/8001/", nil); code < 500 {
		t.Fatalf("preview of a closed port: %d", code)
	}

	// The rows land when each connection ends: wait for all five.
	var rows []event
	testutil.WaitFor(t, time.Minute, func() bool {
		rows = rows[:0]
		for _, ev := range events(t, e, sb.ID) {
			if ev.Action == "net.inbound" {
				rows = append(rows, ev)
			}
		}
		return len(rows) >= published+2
	})
	var viaPublish, viaPorts, refused int
	for _, ev := range rows {
		d := ev.Detail
		switch {
		case d["via"] == "publish" && d["result"] == "ok":
			if d["port"] != float64(8000) || d["peer"] != "127.0.0.1" || d["bytes_in"].(float64) <= 0 || d["bytes_out"].(float64) <= 0 {
				t.Errorf("published-port row %v", d)
			}
			viaPublish++
		case d["via"] == "ports" && d["result"] == "ok":
			if d["port"] != float64(8000) || d["peer"] != "127.0.0.1" || d["bytes_out"].(float64) <= 0 {
				t.Errorf("preview row %v", d)
			}
			viaPorts++
		case d["via"] == "ports" && d["result"] == "refused":
			if d["port"] != float64(8001) {
				t.Errorf("refused row %v", d)
			}
			refused++
		}
	}
	if viaPublish != published || viaPorts != 1 || refused != 1 {
		t.Fatalf("net.inbound rows: %d published, %d preview, %d refused; want %d, 1, 1:\n%s", viaPublish, viaPorts, refused, published, dumpEvents(rows))
	}
	// The CLI's type filter finds them.
	if out := e.must(t, "events", sb.ID, "--type", "net.inbound"); strings.Count(out, `"net.inbound"`) < published+2 {
		t.Errorf("airlock events --type net.inbound:\n%s", out)
	}
}
