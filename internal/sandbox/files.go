package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// fileErr categorizes an agent file-RPC error (the guest's text stays data:
// it is wrapped, never parsed).
func fileErr(op, p string, err error) error {
	switch code := connect.CodeOf(err); code {
	case connect.CodeUnknown, connect.CodeInternal, connect.CodeCanceled:
		return fmt.Errorf("%s %s: %w", op, p, err)
	default:
		return fmt.Errorf("%w: %s %s: %w", category(code), op, p, err)
	}
}

// WriteFile streams r into the guest file p (created with mode, parents
// made) through c, and returns the bytes written. The caller validates p.
// Nothing is buffered beyond one chunk.
func WriteFile(ctx context.Context, c *agentapi.Client, p string, mode uint32, r io.Reader) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := c.Files.Write(ctx)
	if err := st.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Header{Header: &agentv1.WriteHeader{
		Path: p, Mode: mode, Parents: true,
	}}}); err != nil {
		_, rerr := st.CloseAndReceive()
		return 0, fileErr("write", p, errors.Join(err, rerr))
	}
	buf := make([]byte, agentapi.ChunkSize)
	var sent int64
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := st.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Data{Data: buf[:n]}}); err != nil {
				break // the reason comes from CloseAndReceive
			}
			sent += int64(n)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			cancel()
			_, _ = st.CloseAndReceive()
			return sent, fmt.Errorf("read source of %s: %w", p, rerr)
		}
	}
	resp, err := st.CloseAndReceive()
	if err != nil {
		return sent, fileErr("write", p, err)
	}
	if resp.Msg.GetBytesWritten() != uint64(sent) {
		return sent, fmt.Errorf("write %s: guest wrote %d of %d bytes", p, resp.Msg.GetBytesWritten(), sent)
	}
	return sent, nil
}

// ReadFile streams the guest file p to w through c, refusing more than
// limit bytes (a hostile guest must not make the host store more than the
// sandbox's disk can hold). info, if not nil, is called with the file's
// metadata before the first byte. It returns the bytes copied.
func ReadFile(ctx context.Context, c *agentapi.Client, p string, limit int64, w io.Writer, info func(*agentv1.FileInfo)) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Files.Read(ctx, connect.NewRequest(&agentv1.ReadRequest{Path: p}))
	if err != nil {
		return 0, fileErr("read", p, err)
	}
	defer st.Close()
	var n int64
	for st.Receive() {
		switch m := st.Msg().GetMsg().(type) {
		case *agentv1.ReadResponse_Info:
			if info != nil {
				info(m.Info)
			}
		case *agentv1.ReadResponse_Data:
			if n+int64(len(m.Data)) > limit {
				return n, fmt.Errorf("%w: read %s: the guest sent more than %d bytes (the sandbox's disk size)", errdefs.ErrResourceExhausted, p, limit)
			}
			k, err := w.Write(m.Data)
			n += int64(k)
			if err != nil {
				return n, fmt.Errorf("copy %s: %w", p, err)
			}
		}
	}
	if err := st.Err(); err != nil {
		return n, fileErr("read", p, err)
	}
	return n, nil
}

// withFiles runs fn with an agent client for sandbox id.
func (m *Manager) withFiles(ctx context.Context, id string, fn func(c *agentapi.Client) error) error {
	c, closeFn, err := m.Connect(ctx, id)
	if err != nil {
		return err
	}
	defer closeFn()
	return fn(c)
}

// WriteFile streams r into file p of sandbox id (see the package function).
func (m *Manager) WriteFile(ctx context.Context, id, p string, mode uint32, r io.Reader) (n int64, err error) {
	err = m.withFiles(ctx, id, func(c *agentapi.Client) error {
		n, err = WriteFile(ctx, c, p, mode, r)
		return err
	})
	return n, err
}

// ReadFile streams file p of sandbox id to w, at most the sandbox's disk
// size (see the package function).
func (m *Manager) ReadFile(ctx context.Context, id, p string, w io.Writer, info func(*agentv1.FileInfo)) (n int64, err error) {
	sb, err := m.get(ctx, id)
	if err != nil {
		return 0, err
	}
	err = m.withFiles(ctx, id, func(c *agentapi.Client) error {
		n, err = ReadFile(ctx, c, p, int64(sb.DiskMiB)<<20, w, info)
		return err
	})
	return n, err
}

// StatFile describes file p of sandbox id.
func (m *Manager) StatFile(ctx context.Context, id, p string) (fi *agentv1.FileInfo, err error) {
	err = m.withFiles(ctx, id, func(c *agentapi.Client) error {
		r, err := c.Files.Stat(ctx, connect.NewRequest(&agentv1.StatRequest{Path: p}))
		if err != nil {
			return fileErr("stat", p, err)
		}
		fi = r.Msg.GetInfo()
		return nil
	})
	return fi, err
}

// ListFiles lists directory p of sandbox id to depth levels; truncated
// reports that the guest's entry cap was reached.
func (m *Manager) ListFiles(ctx context.Context, id, p string, depth uint32) (entries []*agentv1.FileInfo, truncated bool, err error) {
	err = m.withFiles(ctx, id, func(c *agentapi.Client) error {
		r, err := c.Files.List(ctx, connect.NewRequest(&agentv1.ListRequest{Path: p, Depth: depth}))
		if err != nil {
			return fileErr("list", p, err)
		}
		entries, truncated = r.Msg.GetEntries(), r.Msg.GetTruncated()
		return nil
	})
	return entries, truncated, err
}

// Mkdir makes directory p in sandbox id (and its parents if asked).
func (m *Manager) Mkdir(ctx context.Context, id, p string, parents bool) error {
	return m.withFiles(ctx, id, func(c *agentapi.Client) error {
		if _, err := c.Files.Mkdir(ctx, connect.NewRequest(&agentv1.MkdirRequest{Path: p, Parents: parents, Mode: 0o755})); err != nil {
			return fileErr("mkdir", p, err)
		}
		return nil
	})
}

// RemoveFile removes p in sandbox id (a directory's contents too if
// recursive).
func (m *Manager) RemoveFile(ctx context.Context, id, p string, recursive bool) error {
	return m.withFiles(ctx, id, func(c *agentapi.Client) error {
		if _, err := c.Files.Remove(ctx, connect.NewRequest(&agentv1.RemoveRequest{Path: p, Recursive: recursive})); err != nil {
			return fileErr("remove", p, err)
		}
		return nil
	})
}
