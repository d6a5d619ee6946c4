package shimconf

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
)

func valid() Doc {
	return Doc{
		Version: Version, StateDir: "/var/lib/airlock", ID: "abcdefghijklmnopqrst", Runtime: "qemu", DiskReserve: -1,
		Options: Options{Accel: "tcg", LogLevel: "debug", HostCgroups: "on", DNS: "127.0.0.1:5353",
			UpstreamCAFile: "/etc/ca.pem", TestDialMap: "192.0.2.1=127.0.0.1", ProcAudit: "off"},
		Secrets: netconf.Values{"API_KEY": "s3cr3t-value"},
	}
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for _, d := range []Doc{valid(), {Version: Version, StateDir: "/s", ID: "x", Runtime: "gvisor", Options: Options{}.WithDefaults()}} {
		var buf bytes.Buffer
		if err := Write(&buf, d); err != nil {
			t.Fatal(err)
		}
		got, err := Read(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, d) {
			t.Fatalf("round trip: %+v, want %+v", got, d)
		}
	}
	// The embedded options are fields of the document itself.
	var buf bytes.Buffer
	if err := Write(&buf, valid()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"accel":"tcg"`) || strings.Contains(buf.String(), "Options") {
		t.Fatalf("document %s", buf.String())
	}
}

func TestReadRefuses(t *testing.T) {
	t.Parallel()
	var good bytes.Buffer
	if err := Write(&good, valid()); err != nil {
		t.Fatal(err)
	}
	doc := good.String()
	for _, c := range []struct{ name, doc, want string }{
		{"empty", "", "empty"},
		{"unknown field", strings.Replace(doc, `"version":1`, `"version":1,"lifetime":"1h"`, 1), `unknown field "lifetime"`},
		{"missing id", strings.Replace(doc, `"id":"abcdefghijklmnopqrst"`, `"id":""`, 1), "no sandbox id"},
		{"no id field", strings.Replace(doc, `"id":"abcdefghijklmnopqrst",`, ``, 1), "no sandbox id"},
		{"other version", strings.Replace(doc, `"version":1`, `"version":2`, 1), "version 2"},
		{"relative state dir", strings.Replace(doc, `"/var/lib/airlock"`, `"var/lib"`, 1), "state_dir"},
		{"bad runtime", strings.Replace(doc, `"runtime":"qemu"`, `"runtime":"docker"`, 1), `runtime "docker"`},
		{"bad accel", strings.Replace(doc, `"accel":"tcg"`, `"accel":"hvf"`, 1), `accel "hvf"`},
		{"bad log level", strings.Replace(doc, `"log_level":"debug"`, `"log_level":"loud"`, 1), "log_level"},
		{"bad host cgroups", strings.Replace(doc, `"host_cgroups":"on"`, `"host_cgroups":"yes"`, 1), "host_cgroups"},
		{"bad proc audit", strings.Replace(doc, `"proc_audit":"off"`, `"proc_audit":"no"`, 1), "proc_audit"},
		{"two documents", doc + doc, "data after the document"},
		{"not JSON", "{" + doc, "not JSON"},
		{"truncated", doc[:len(doc)-5], "truncated"},
		{"wrong type", strings.Replace(doc, `"s3cr3t-value"`, `42`, 1), `field "secrets"`},
		{"oversized", `{"dns":"` + strings.Repeat("x", MaxSize) + `"}`, "more than"},
	} {
		_, err := Read(strings.NewReader(c.doc))
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalid with %q", c.name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: the error quotes the secret: %v", c.name, err)
		}
	}
}

func TestValidateSecrets(t *testing.T) {
	t.Parallel()
	d := valid()
	d.Secrets = netconf.Values{"BIG": strings.Repeat("v", netconf.MaxSecretLen+1)}
	if err := d.Validate(); !errors.Is(err, errdefs.ErrInvalid) || strings.Contains(err.Error(), "vvv") {
		t.Fatalf("oversized secret: %v", err)
	}
	d.Secrets = netconf.Values{}
	for i := range netconf.MaxSecrets + 1 {
		d.Secrets[strings.Repeat("S", i+1)] = "v"
	}
	if err := d.Validate(); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("too many secrets: %v", err)
	}
	d.Secrets = netconf.Values{"": "v"}
	if err := d.Validate(); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("unnamed secret: %v", err)
	}
	// The largest secrets allowed, escaped at worst, still fit.
	d.Secrets = netconf.Values{}
	for i := range netconf.MaxSecrets {
		d.Secrets[strings.Repeat("S", i+1)] = strings.Repeat("\x01", netconf.MaxSecretLen)
	}
	var buf bytes.Buffer
	if err := Write(&buf, d); err != nil {
		t.Fatalf("largest secrets: %v", err)
	}
	if _, err := Read(&buf); err != nil {
		t.Fatalf("largest secrets: %v", err)
	}
}
