package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

// writeRemote writes data to p through the Write RPC in 256 KiB chunks.
func (env *testEnv) writeRemote(ctx context.Context, hdr *agentv1.WriteHeader, data []byte) (*agentv1.WriteResponse, error) {
	stream := env.c.Files.Write(ctx)
	if err := stream.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Header{Header: hdr}}); err != nil {
		_, err2 := stream.CloseAndReceive()
		return nil, err2
	}
	for i := 0; i < len(data); i += 256 << 10 {
		chunk := data[i:min(len(data), i+256<<10)]
		if err := stream.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Data{Data: chunk}}); err != nil {
			break // the real error comes from CloseAndReceive
		}
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// readRemote reads p through the Read RPC.
func (env *testEnv) readRemote(ctx context.Context, p string) (*agentv1.FileInfo, []byte, error) {
	stream, err := env.c.Files.Read(ctx, connect.NewRequest(&agentv1.ReadRequest{Path: p}))
	if err != nil {
		return nil, nil, err
	}
	defer stream.Close()
	var info *agentv1.FileInfo
	var data bytes.Buffer
	for stream.Receive() {
		switch m := stream.Msg().GetMsg().(type) {
		case *agentv1.ReadResponse_Info:
			info = m.Info
		case *agentv1.ReadResponse_Data:
			if info == nil {
				return nil, nil, os.ErrInvalid
			}
			data.Write(m.Data)
		}
	}
	return info, data.Bytes(), stream.Err()
}

func TestFileWriteReadRoundTrip(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	dir := t.TempDir()
	data := make([]byte, 3<<20+12345)
	_, _ = rand.Read(data)
	p := filepath.Join(dir, "sub", "blob.bin")

	if _, err := env.writeRemote(t.Context(), &agentv1.WriteHeader{Path: p}, data); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("write without parents into a missing dir: %v, want NotFound", err)
	}
	resp, err := env.writeRemote(t.Context(), &agentv1.WriteHeader{Path: p, Mode: 0o640, Parents: true}, data)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetBytesWritten() != uint64(len(data)) {
		t.Errorf("bytes_written = %d", resp.GetBytesWritten())
	}
	info, got, err := env.readRemote(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	// The agent never compresses: the client offered gzip (connect's
	// default), and the response must still be identity-encoded.
	rs, err := env.c.Files.Read(t.Context(), connect.NewRequest(&agentv1.ReadRequest{Path: p}))
	if err != nil {
		t.Fatal(err)
	}
	rs.Receive()
	if enc := rs.ResponseHeader().Get("Connect-Content-Encoding"); enc != "" && enc != "identity" {
		t.Errorf("response encoding %q", enc)
	}
	rs.Close()
	if sha256.Sum256(got) != sha256.Sum256(data) {
		t.Fatalf("read back %d bytes with another sha256", len(got))
	}
	if info.GetSize() != uint64(len(data)) || info.GetMode() != 0o640 || info.GetType() != agentv1.FileType_FILE_TYPE_REGULAR || info.GetName() != "blob.bin" {
		t.Errorf("info = %v", info)
	}

	// Overwrite with an empty file; the default mode is 0644.
	if _, err := env.writeRemote(t.Context(), &agentv1.WriteHeader{Path: p}, nil); err != nil {
		t.Fatal(err)
	}
	st, err := env.c.Files.Stat(t.Context(), connect.NewRequest(&agentv1.StatRequest{Path: p}))
	if err != nil {
		t.Fatal(err)
	}
	if st.Msg.GetInfo().GetSize() != 0 || st.Msg.GetInfo().GetMode() != 0o644 {
		t.Errorf("after overwrite: %v", st.Msg.GetInfo())
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, "sub", tempPrefix+"*")); len(tmp) != 0 {
		t.Errorf("temporary files left: %v", tmp)
	}

	if os.Geteuid() == 0 {
		owned := filepath.Join(dir, "owned")
		if _, err := env.writeRemote(t.Context(), &agentv1.WriteHeader{Path: owned, User: "alice:staff", Mode: 0o4750}, []byte("x")); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(owned)
		if err != nil {
			t.Fatal(err)
		}
		sys := fi.Sys().(*syscall.Stat_t)
		if sys.Uid != 1234 || sys.Gid != 50 || fi.Mode()&os.ModeSetuid == 0 || fi.Mode().Perm() != 0o750 {
			t.Errorf("owned file: uid %d gid %d mode %v", sys.Uid, sys.Gid, fi.Mode())
		}
	}
}

func TestFileWriteCancelledKeepsOldFile(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "keep.txt")
	writeFile(t, p, "old content")

	ctx, cancel := context.WithCancel(t.Context())
	stream := env.c.Files.Write(ctx)
	_ = stream.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Header{Header: &agentv1.WriteHeader{Path: p}}})
	_ = stream.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Data{Data: bytes.Repeat([]byte("new"), 100000)}})
	// Wait until the agent has created its temporary file, then cancel.
	waitFor(t, func() bool {
		tmp, _ := filepath.Glob(filepath.Join(dir, tempPrefix+"*"))
		return len(tmp) == 1
	})
	// A client that dies sends no END_STREAM: cancel only. (CloseAndReceive
	// right after cancel could still end the request cleanly before the
	// RST_STREAM goes out, and then the agent rightly commits the upload.)
	cancel()
	waitFor(t, func() bool {
		tmp, _ := filepath.Glob(filepath.Join(dir, tempPrefix+"*"))
		return len(tmp) == 0
	})
	if b, _ := os.ReadFile(p); string(b) != "old content" {
		t.Errorf("file after a cancelled write: %d bytes, want the old content", len(b))
	}
	if _, err := stream.CloseAndReceive(); err == nil {
		t.Fatal("cancelled write succeeded")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFileWriteErrors(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		hdr  *agentv1.WriteHeader
		code connect.Code
	}{
		"relative":     {&agentv1.WriteHeader{Path: "x"}, connect.CodeInvalidArgument},
		"root":         {&agentv1.WriteHeader{Path: "/"}, connect.CodeInvalidArgument},
		"directory":    {&agentv1.WriteHeader{Path: dir}, connect.CodeFailedPrecondition},
		"unknown user": {&agentv1.WriteHeader{Path: filepath.Join(dir, "u"), User: "mallory"}, connect.CodeNotFound},
	} {
		if _, err := env.writeRemote(t.Context(), tc.hdr, []byte("x")); connect.CodeOf(err) != tc.code {
			t.Errorf("%s: err = %v, want %v", name, err, tc.code)
		}
	}
	// The first message must be the header.
	stream := env.c.Files.Write(t.Context())
	_ = stream.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Data{Data: []byte("x")}})
	if _, err := stream.CloseAndReceive(); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("data first: err = %v, want InvalidArgument", err)
	}
}

func TestFileReadRefusesNonRegular(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "file"), "x")
	if err := os.Symlink("file", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for p, code := range map[string]connect.Code{
		fifo:                          connect.CodeFailedPrecondition,
		dir:                           connect.CodeFailedPrecondition,
		filepath.Join(dir, "link"):    connect.CodeFailedPrecondition,
		"/dev/null":                   connect.CodeFailedPrecondition,
		filepath.Join(dir, "missing"): connect.CodeNotFound,
		"relative":                    connect.CodeInvalidArgument,
	} {
		if _, _, err := env.readRemote(t.Context(), p); connect.CodeOf(err) != code {
			t.Errorf("read %s: err = %v, want %v", p, err, code)
		}
	}
}

func TestFileList(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	dir := t.TempDir()
	for _, p := range []string{"b/c/d/deep.txt", "b/c/f.txt", "a.txt", "b/e.txt"} {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, full, p)
	}
	if err := os.Symlink("b", filepath.Join(dir, "z-link")); err != nil {
		t.Fatal(err)
	}
	list := func(depth, limit uint32) ([]string, bool) {
		t.Helper()
		resp, err := env.c.Files.List(t.Context(), connect.NewRequest(&agentv1.ListRequest{Path: dir, Depth: depth, MaxEntries: limit}))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range resp.Msg.GetEntries() {
			names = append(names, strings.TrimPrefix(e.GetPath(), dir+"/"))
		}
		return names, resp.Msg.GetTruncated()
	}
	for _, tc := range []struct {
		depth, limit uint32
		want         string
		truncated    bool
	}{
		{0, 0, "a.txt b z-link", false},
		{1, 0, "a.txt b z-link", false},
		{2, 0, "a.txt b b/c b/e.txt z-link", false},
		{9, 0, "a.txt b b/c b/c/d b/c/d/deep.txt b/c/f.txt b/e.txt z-link", false},
		{9, 4, "a.txt b b/c z-link", true}, // breadth first: shallow entries survive
		{1, 3, "a.txt b z-link", false},
	} {
		names, truncated := list(tc.depth, tc.limit)
		if got := strings.Join(names, " "); got != tc.want || truncated != tc.truncated {
			t.Errorf("depth %d max %d: %q truncated=%v, want %q truncated=%v", tc.depth, tc.limit, got, truncated, tc.want, tc.truncated)
		}
	}
	if _, err := env.c.Files.List(t.Context(), connect.NewRequest(&agentv1.ListRequest{Path: filepath.Join(dir, "a.txt")})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("list of a file: %v, want FailedPrecondition", err)
	}
	st, err := env.c.Files.Stat(t.Context(), connect.NewRequest(&agentv1.StatRequest{Path: filepath.Join(dir, "z-link")}))
	if err != nil {
		t.Fatal(err)
	}
	if st.Msg.GetInfo().GetType() != agentv1.FileType_FILE_TYPE_SYMLINK || st.Msg.GetInfo().GetSymlinkTarget() != "b" {
		t.Errorf("stat of a symlink: %v", st.Msg.GetInfo())
	}
}

func TestFileMkdirRemove(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	c, ctx := env.c.Files, t.Context()
	dir := t.TempDir()
	deep := filepath.Join(dir, "x", "y", "z")
	if _, err := c.Mkdir(ctx, connect.NewRequest(&agentv1.MkdirRequest{Path: deep})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("mkdir without parents: %v, want NotFound", err)
	}
	if _, err := c.Mkdir(ctx, connect.NewRequest(&agentv1.MkdirRequest{Path: deep, Parents: true, Mode: 0o700})); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(deep); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("mkdir result: %v %v", fi, err)
	}
	if _, err := c.Mkdir(ctx, connect.NewRequest(&agentv1.MkdirRequest{Path: deep, Parents: true})); err != nil {
		t.Errorf("mkdir -p of an existing dir: %v", err)
	}
	if _, err := c.Mkdir(ctx, connect.NewRequest(&agentv1.MkdirRequest{Path: deep})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("mkdir of an existing dir: %v, want AlreadyExists", err)
	}
	x := filepath.Join(dir, "x")
	if _, err := c.Remove(ctx, connect.NewRequest(&agentv1.RemoveRequest{Path: x})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("remove of a non-empty dir: %v, want FailedPrecondition", err)
	}
	if _, err := c.Remove(ctx, connect.NewRequest(&agentv1.RemoveRequest{Path: x, Recursive: true})); err != nil {
		t.Errorf("recursive remove: %v", err)
	}
	if _, err := os.Stat(x); !os.IsNotExist(err) {
		t.Errorf("still there: %v", err)
	}
	for p, code := range map[string]connect.Code{
		x:                               connect.CodeNotFound,
		"/":                             connect.CodeInvalidArgument,
		dir + "/":                       connect.CodeInvalidArgument,
		dir + "/./x":                    connect.CodeInvalidArgument,
		"/a\x00b":                       connect.CodeInvalidArgument,
		"/" + strings.Repeat("a", 4096): connect.CodeInvalidArgument,
	} {
		if _, err := c.Remove(ctx, connect.NewRequest(&agentv1.RemoveRequest{Path: p, Recursive: true})); connect.CodeOf(err) != code {
			t.Errorf("remove %.40q: %v, want %v", p, err, code)
		}
	}
}
