package shimclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2/shimv2connect"
)

// ChunkSize is the most file data one Write message carries.
const ChunkSize = 256 << 10

// files returns a FileService client on c's connection (a client is a few
// small values: made per call, the connection is what is shared).
func (c *Client) files() shimv2connect.FileServiceClient {
	return shimv2connect.NewFileServiceClient(c.hc, baseURL, clientOptions()...)
}

// fileErr categorizes a FileService error as op on guest path p. The
// guest's text stays data: it is wrapped, never parsed. Errors without a
// better category (unknown, internal, cancelled) stay uncategorized.
func fileErr(op, p string, err error) error {
	switch code := connect.CodeOf(err); code {
	case connect.CodeUnknown, connect.CodeInternal, connect.CodeCanceled:
		return fmt.Errorf("%s %s: %w", op, p, err)
	default:
		return fmt.Errorf("%w: %s %s: %w", category(code), op, p, err)
	}
}

func fileType(t shimv2.FileType) guest.FileType {
	switch t {
	case shimv2.FileType_FILE_TYPE_REGULAR:
		return guest.FileRegular
	case shimv2.FileType_FILE_TYPE_DIRECTORY:
		return guest.FileDirectory
	case shimv2.FileType_FILE_TYPE_SYMLINK:
		return guest.FileSymlink
	case shimv2.FileType_FILE_TYPE_OTHER:
		return guest.FileOther
	}
	return guest.FileUnknown
}

func fileInfo(in *shimv2.FileInfo) guest.FileInfo {
	return guest.FileInfo{
		Path: in.GetPath(), Name: in.GetName(), Type: fileType(in.GetType()), Size: in.GetSize(), Mode: in.GetMode(),
		Mtime: time.Unix(0, in.GetMtimeUnixNano()), UID: in.GetUid(), GID: in.GetGid(), SymlinkTarget: in.GetSymlinkTarget(),
	}
}

// StatFile describes guest path p (a symlink is not followed).
func (c *Client) StatFile(ctx context.Context, p string) (guest.FileInfo, error) {
	resp, err := c.files().Stat(ctx, connect.NewRequest(&shimv2.StatFileRequest{Path: p}))
	if err != nil {
		return guest.FileInfo{}, fileErr("stat", p, err)
	}
	return fileInfo(resp.Msg.GetInfo()), nil
}

// ListFiles lists directory p to depth levels.
func (c *Client) ListFiles(ctx context.Context, p string, depth uint32) (guest.FileList, error) {
	resp, err := c.files().List(ctx, connect.NewRequest(&shimv2.ListFilesRequest{Path: p, Depth: depth}))
	if err != nil {
		return guest.FileList{}, fileErr("list", p, err)
	}
	out := guest.FileList{Truncated: resp.Msg.GetTruncated(), Entries: make([]guest.FileInfo, 0, len(resp.Msg.GetEntries()))}
	for _, e := range resp.Msg.GetEntries() {
		out.Entries = append(out.Entries, fileInfo(e))
	}
	return out, nil
}

// Mkdir makes directory p with mode (0: 0755), and its parents if asked
// (then an existing directory is fine).
func (c *Client) Mkdir(ctx context.Context, p string, parents bool, mode uint32) error {
	if _, err := c.files().Mkdir(ctx, connect.NewRequest(&shimv2.MkdirRequest{Path: p, Parents: parents, Mode: mode})); err != nil {
		return fileErr("mkdir", p, err)
	}
	return nil
}

// RemoveFile removes p (a directory's contents too if recursive).
func (c *Client) RemoveFile(ctx context.Context, p string, recursive bool) error {
	if _, err := c.files().Remove(ctx, connect.NewRequest(&shimv2.RemoveFileRequest{Path: p, Recursive: recursive})); err != nil {
		return fileErr("remove", p, err)
	}
	return nil
}

// WriteFile streams r into guest file p (created with mode, parents made)
// and returns the bytes written. Nothing is buffered beyond one chunk. On
// any error the guest keeps the old file.
func (c *Client) WriteFile(ctx context.Context, p string, mode uint32, r io.Reader) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := c.files().Write(ctx)
	if err := st.Send(&shimv2.WriteFileRequest{Msg: &shimv2.WriteFileRequest_Header{Header: &shimv2.WriteFileHeader{
		Path: p, Mode: mode, Parents: true,
	}}}); err != nil {
		_, rerr := st.CloseAndReceive()
		return 0, fileErr("write", p, errors.Join(err, rerr))
	}
	buf := make([]byte, ChunkSize)
	var sent int64
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := st.Send(&shimv2.WriteFileRequest{Msg: &shimv2.WriteFileRequest_Data{Data: buf[:n]}}); err != nil {
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

// ReadFile streams guest file p to w, refusing more than limit bytes (a
// hostile guest must not make the host store more than the sandbox's disk
// can hold: ErrResourceExhausted). info, if not nil, is called with the
// file's metadata before the first byte. It returns the bytes copied.
func (c *Client) ReadFile(ctx context.Context, p string, limit int64, w io.Writer, info func(guest.FileInfo)) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.files().Read(ctx, connect.NewRequest(&shimv2.ReadFileRequest{Path: p}))
	if err != nil {
		return 0, fileErr("read", p, err)
	}
	defer st.Close()
	var n int64
	for st.Receive() {
		switch m := st.Msg().GetMsg().(type) {
		case *shimv2.ReadFileResponse_Info:
			if info != nil {
				info(fileInfo(m.Info))
			}
		case *shimv2.ReadFileResponse_Data:
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

// Rename renames from to to within one guest filesystem.
func (c *Client) Rename(ctx context.Context, from, to string) error {
	if _, err := c.files().Rename(ctx, connect.NewRequest(&shimv2.RenameFileRequest{From: from, To: to})); err != nil {
		return fileErr("rename", from, err)
	}
	return nil
}

// Watch watches directory p (and below it if recursive): started is
// called once the watch is in place, then fn for each change, until ctx
// ends (nil), fn fails (its error) or the guest ends the watch.
func (c *Client) Watch(ctx context.Context, p string, recursive bool, started func(), fn func(guest.FileEvent) error) error {
	st, err := c.files().Watch(ctx, connect.NewRequest(&shimv2.WatchFilesRequest{Path: p, Recursive: recursive}))
	if err != nil {
		return fileErr("watch", p, err)
	}
	defer st.Close()
	for st.Receive() {
		switch m := st.Msg().GetMsg().(type) {
		case *shimv2.WatchFilesResponse_Started:
			started()
		case *shimv2.WatchFilesResponse_Event:
			if err := fn(guest.FileEvent{Name: m.Event.GetName(), Op: guest.FileOp(m.Event.GetOp())}); err != nil {
				return err
			}
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := st.Err(); err != nil {
		return fileErr("watch", p, err)
	}
	return fmt.Errorf("%w: watch %s: the guest ended the watch", errdefs.ErrUnavailable, p)
}

// WriteArchive streams the tar stream r into guest directory p (made if
// missing) and returns what the guest made. The guest refuses entries
// that would leave p (ErrInvalid) and caps entries and bytes
// (ErrResourceExhausted); on an error, what it made so far stays.
func (c *Client) WriteArchive(ctx context.Context, p string, r io.Reader) (guest.ArchiveResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := c.files().WriteTar(ctx)
	if err := st.Send(&shimv2.WriteTarRequest{Msg: &shimv2.WriteTarRequest_Header{Header: &shimv2.WriteTarHeader{Path: p}}}); err != nil {
		_, rerr := st.CloseAndReceive()
		return guest.ArchiveResult{}, fileErr("extract into", p, errors.Join(err, rerr))
	}
	buf := make([]byte, ChunkSize)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := st.Send(&shimv2.WriteTarRequest{Msg: &shimv2.WriteTarRequest_Data{Data: buf[:n]}}); err != nil {
				break // the reason comes from CloseAndReceive
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			// Cancel: the guest must not take what came as the whole archive.
			cancel()
			_, _ = st.CloseAndReceive()
			return guest.ArchiveResult{}, fmt.Errorf("read the archive for %s: %w", p, rerr)
		}
	}
	resp, err := st.CloseAndReceive()
	if err != nil {
		return guest.ArchiveResult{}, fileErr("extract into", p, err)
	}
	return guest.ArchiveResult{Entries: int64(min(resp.Msg.GetEntries(), 1<<62)), Bytes: int64(min(resp.Msg.GetBytes(), 1<<62))}, nil
}

// ReadArchive streams a tar of guest path p (a file or a directory tree,
// named base(p)/...) to w, refusing more than limit bytes
// (ErrResourceExhausted), and returns the bytes copied. The stream is
// the guest's: whoever extracts it must treat it as hostile. On an error
// what reached w is not a whole archive.
func (c *Client) ReadArchive(ctx context.Context, p string, limit int64, w io.Writer) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.files().ReadTar(ctx, connect.NewRequest(&shimv2.ReadTarRequest{Path: p}))
	if err != nil {
		return 0, fileErr("archive", p, err)
	}
	defer st.Close()
	var n int64
	for st.Receive() {
		data := st.Msg().GetData()
		if n+int64(len(data)) > limit {
			return n, fmt.Errorf("%w: archive %s: the guest sent more than %d bytes", errdefs.ErrResourceExhausted, p, limit)
		}
		k, err := w.Write(data)
		n += int64(k)
		if err != nil {
			return n, fmt.Errorf("copy the archive of %s: %w", p, err)
		}
	}
	if err := st.Err(); err != nil {
		return n, fileErr("archive", p, err)
	}
	return n, nil
}
