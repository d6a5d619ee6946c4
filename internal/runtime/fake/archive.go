package fake

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/archive"
)

// The fake's tar RPCs keep files and directories only (symlinks, hard
// links and special files are refused): enough to test the relay, the
// manager and the API. The real agent's are tested in internal/agent and
// in the guest.

func (a *agent) WriteTar(_ context.Context, st *connect.ClientStream[agentv1.WriteTarRequest]) (*connect.Response[agentv1.WriteTarResponse], error) {
	if !st.Receive() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("empty tar stream: %w", st.Err()))
	}
	h := st.Msg().GetHeader()
	if h == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("first message must be the header"))
	}
	dest, err := cleanPath(h.GetPath())
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	for st.Receive() {
		buf.Write(st.Msg().GetData())
	}
	if err := st.Err(); err != nil {
		return nil, err
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	if e := a.fs.files[dest]; e == nil {
		if err := a.fs.mkdirLocked(dest, 0o755, true); err != nil {
			return nil, err
		}
	} else if !e.dir {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("not a directory"))
	}
	tr := tar.NewReader(&buf)
	resp := &agentv1.WriteTarResponse{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, err)
		}
		name, err := archive.CleanName(hdr.Name)
		if err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, err)
		}
		p := path.Join(dest, name)
		mode := uint32(hdr.Mode) & 0o1777 //nolint:gosec // masked
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := a.fs.mkdirLocked(p, mode, true); err != nil {
				return nil, err
			}
			a.fs.files[p].mode = mode
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, err)
			}
			if err := a.fs.mkdirLocked(path.Dir(p), 0o755, true); err != nil {
				return nil, err
			}
			if e := a.fs.files[p]; e != nil && e.dir {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("a directory is in the way"))
			}
			a.fs.files[p] = &file{data: data, mode: mode & 0o777, mtime: hdr.ModTime}
			resp.Bytes += uint64(len(data))
		default:
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("the fake agent keeps no entry of type %q", hdr.Typeflag))
		}
		resp.Entries++
	}
	return connect.NewResponse(resp), nil
}

func (a *agent) ReadTar(_ context.Context, req *connect.Request[agentv1.ReadTarRequest], st *connect.ServerStream[agentv1.ReadTarResponse]) error {
	p, err := cleanPath(req.Msg.GetPath())
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	a.fs.mu.Lock()
	if a.fs.files[p] == nil {
		a.fs.mu.Unlock()
		return notFound()
	}
	base := path.Base(p)
	for _, q := range slices.Sorted(maps.Keys(a.fs.files)) {
		if q != p && !strings.HasPrefix(q, p+"/") {
			continue
		}
		e := a.fs.files[q]
		h := &tar.Header{Name: base + strings.TrimPrefix(q, p), Mode: int64(e.mode), ModTime: e.mtime, Typeflag: tar.TypeReg, Size: int64(len(e.data))}
		if e.dir {
			h.Typeflag, h.Name, h.Size = tar.TypeDir, h.Name+"/", 0
		}
		if tw.WriteHeader(h) == nil {
			_, _ = tw.Write(e.data)
		}
	}
	a.fs.mu.Unlock()
	if err := tw.Close(); err != nil {
		return err
	}
	for data := buf.Bytes(); len(data) > 0; {
		n := min(len(data), 64<<10)
		if err := st.Send(&agentv1.ReadTarResponse{Data: data[:n]}); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}
