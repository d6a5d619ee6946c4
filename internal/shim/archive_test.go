package shim

import (
	"archive/tar"
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
	"github.com/airlock-sandbox/airlock/internal/store"
)

func testTar(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o750}); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o640, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestArchiveThroughShimAndManager: a tar goes into a guest directory and
// comes back out through the shim's relay (fake agent), with the shim's
// path checks, the client's byte cap and the manager's audit event.
func TestArchiveThroughShimAndManager(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	m := h.manager()
	ctx := t.Context()
	c := sandbox.Local()

	res, err := m.WriteArchive(ctx, c, h.id, "/srv/tree", bytes.NewReader(testTar(t, map[string]string{"d/a.txt": "hello"})))
	if err != nil || res.Entries != 2 || res.Bytes != 5 {
		t.Fatalf("write archive: %+v %v", res, err)
	}
	fi, err := m.StatFile(ctx, c, h.id, "/srv/tree/d/a.txt")
	if err != nil || fi.Type != guest.FileRegular || fi.Size != 5 || fi.Mode != 0o640 {
		t.Fatalf("stat: %+v %v", fi, err)
	}
	var out bytes.Buffer
	if _, err := m.ReadArchive(ctx, c, h.id, "/srv/tree", &out); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&out)
	var names []string
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, hdr.Name)
	}
	if strings.Join(names, ",") != "tree/,tree/d/,tree/d/a.txt" {
		t.Fatalf("archive names %v", names)
	}

	// The shim's client refuses more than its limit.
	sc := shimclient.New(h.l.Socket(h.id))
	defer sc.Close()
	if _, err := sc.ReadArchive(ctx, "/srv/tree", 512, &bytes.Buffer{}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("read archive past the limit: %v", err)
	}
	// Paths are checked before the guest sees them; names by the guest.
	if _, err := m.WriteArchive(ctx, c, h.id, "/srv/../etc", bytes.NewReader(testTar(t, nil))); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("unclean path: %v", err)
	}
	if _, err := m.ReadArchive(ctx, c, h.id, "srv", &bytes.Buffer{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("relative path: %v", err)
	}
	if _, err := m.WriteArchive(ctx, c, h.id, "/srv/x", bytes.NewReader(testTar(t, map[string]string{"../escape": "x"}))); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("escaping name: %v", err)
	}
	if _, err := m.StatFile(ctx, c, h.id, "/srv/escape"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the escaping entry landed: %v", err)
	}
	if _, err := m.ReadArchive(ctx, c, h.id, "/nope", &bytes.Buffer{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing path: %v", err)
	}

	evs, err := h.st.ListEvents(ctx, store.EventFilter{SandboxID: h.id, Type: "file"})
	if err != nil || len(evs) != 3 {
		t.Fatalf("file events: %v %v", evs, err)
	}
	if e := evs[0]; e.Action != "file.extract" || e.Detail["path"] != "/srv/tree" || e.Detail["entries"] != float64(2) ||
		e.Detail["size"] != float64(5) || e.Detail["failed"] != nil {
		t.Errorf("first event %s %v", e.Action, e.Detail)
	}
	if e := evs[2]; e.Action != "file.extract" || e.Detail["failed"] != true {
		t.Errorf("last event %s %v", e.Action, e.Detail)
	}
	h.stop(t)
}

// TestArchiveNeedsProtocol6: an agent older than protocol 6 gets a clear
// FAILED_PRECONDITION (update the guest) before anything reaches it.
func TestArchiveNeedsProtocol6(t *testing.T) {
	t.Parallel()
	f := fileService{agent: &agentapi.Client{Info: &agentv1.InfoResponse{ProtocolVersion: agentapi.VersionArchive - 1}}}
	err := f.ReadTar(t.Context(), connect.NewRequest(&shimv2.ReadTarRequest{Path: "/srv"}), nil)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !errors.Is(err, agentapi.ErrUnsupported) ||
		!strings.Contains(err.Error(), "airlock setup") {
		t.Fatalf("ReadTar on protocol 5: %v", err)
	}
	f.agent.Info.ProtocolVersion = agentapi.VersionArchive
	if err := f.requireArchive(); err != nil {
		t.Fatalf("protocol 6: %v", err)
	}
}
