package agent

import (
	"bufio"
	"context"
	"errors"
	"io"
	"path"
	"syscall"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/archive"
)

// Directories as tar streams (protocol >= 6). The tar handling, and every
// defence against a hostile archive, is internal/archive's: the same code
// extracts what a guest sends on the host.

// maxTarTrailer caps what may follow the end-of-archive marker: tar pads
// its output to a whole record (10 KiB by default), anything longer is not
// padding.
const maxTarTrailer = 1 << 20

// WriteTar extracts the streamed archive into header.path (made if
// missing), as header.user. Nothing is written outside that directory;
// see archive.Extract for what is refused.
func (f *fileService) WriteTar(ctx context.Context, stream *connect.ClientStream[agentv1.WriteTarRequest]) (*connect.Response[agentv1.WriteTarResponse], error) {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, invalidf("tar stream has no header")
	}
	hdr := stream.Msg().GetHeader()
	if hdr == nil {
		return nil, invalidf("the first tar message must be header")
	}
	p := hdr.GetPath()
	if err := checkPath(p); err != nil {
		return nil, err
	}
	var opt archive.ExtractOptions
	if hdr.GetUser() != "" {
		id, err := f.users.resolve(hdr.GetUser())
		if err != nil {
			return nil, err
		}
		opt.Chown, opt.UID, opt.GID = true, int(id.uid), int(id.gid)
	}
	var st unix.Stat_t
	err := unix.Stat(p, &st)
	switch {
	case errors.Is(err, unix.ENOENT):
		if err := mkdirAll(p); err != nil {
			return nil, sysError("mkdir", err)
		}
		if opt.Chown {
			if err := unix.Chown(p, opt.UID, opt.GID); err != nil {
				return nil, sysError("chown", err)
			}
		}
	case err != nil:
		return nil, sysError("stat", err)
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return nil, preconditionf("not a directory")
	}
	// The file data can never exceed the filesystem it lands on; the cap
	// fails a bigger archive up front instead of after filling the disk.
	var fs unix.Statfs_t
	if err := unix.Statfs(p, &fs); err == nil && fs.Bsize > 0 {
		opt.Limits.MaxBytes = int64(fs.Blocks) * fs.Bsize //nolint:gosec // block counts are far below 2^63
	}
	in := &tarStream{stream: stream}
	stats, err := archive.Extract(ctx, in, p, opt)
	if err != nil {
		return nil, archiveError(err)
	}
	n, err := io.Copy(io.Discard, io.LimitReader(in, maxTarTrailer+1))
	if err != nil {
		return nil, archiveError(err)
	}
	if n > maxTarTrailer {
		return nil, invalidf("more than %d bytes after the end of the archive", maxTarTrailer)
	}
	syncFS(p)
	return connect.NewResponse(&agentv1.WriteTarResponse{Entries: uint64(stats.Entries()), Bytes: uint64(stats.Bytes)}), nil //nolint:gosec // counts are never negative
}

// ReadTar streams a tar of path: base(path) and everything below it.
func (f *fileService) ReadTar(ctx context.Context, req *connect.Request[agentv1.ReadTarRequest], stream *connect.ServerStream[agentv1.ReadTarResponse]) error {
	p := req.Msg.GetPath()
	if err := checkPath(p); err != nil {
		return err
	}
	if p == "/" {
		return invalidf("cannot archive /")
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return sysError("stat", err)
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFDIR && t != unix.S_IFREG {
		return preconditionf("not a file or directory")
	}
	w := bufio.NewWriterSize(tarSender{stream}, readChunk)
	if _, err := archive.Write(ctx, w, p, archive.WriteOptions{Name: path.Base(p)}); err != nil {
		return archiveError(err)
	}
	return w.Flush()
}

// tarStream reads the data of a WriteTar stream after its header.
type tarStream struct {
	stream *connect.ClientStream[agentv1.WriteTarRequest]
	buf    []byte
	err    error
}

func (s *tarStream) Read(b []byte) (int, error) {
	for len(s.buf) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		if !s.stream.Receive() {
			s.err = s.stream.Err()
			if s.err == nil {
				s.err = io.EOF
			}
			continue
		}
		if s.stream.Msg().GetHeader() != nil {
			s.err = invalidf("tar stream has a second header")
			continue
		}
		s.buf = s.stream.Msg().GetData()
	}
	n := copy(b, s.buf)
	s.buf = s.buf[n:]
	return n, nil
}

// tarSender sends what is written as ReadTar data messages of at most
// readChunk bytes.
type tarSender struct {
	stream *connect.ServerStream[agentv1.ReadTarResponse]
}

func (s tarSender) Write(b []byte) (int, error) {
	n := 0
	for n < len(b) {
		c := b[n:min(len(b), n+readChunk)]
		if err := s.stream.Send(&agentv1.ReadTarResponse{Data: c}); err != nil {
			return n, err
		}
		n += len(c)
	}
	return n, nil
}

// archiveError turns an error of archive.Extract or archive.Write into an
// RPC error. Archive errors carry entry names (the caller's own data, at
// most maxErrorText bytes of them), never more.
func archiveError(err error) error {
	if ce, ok := errors.AsType[*connect.Error](err); ok {
		return ce
	}
	switch {
	case errors.Is(err, archive.ErrInvalid):
		return invalidf("%s", err.Error())
	case errors.Is(err, archive.ErrLimit):
		return connect.NewError(connect.CodeResourceExhausted, errors.New(truncate(err.Error())))
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeCanceled, err)
	}
	if errno, ok := errors.AsType[syscall.Errno](err); ok {
		return connect.NewError(errnoCode(errno), errors.New(truncate(err.Error())))
	}
	return connect.NewError(connect.CodeInternal, errors.New(truncate(err.Error())))
}

// syncFS makes what an extraction wrote durable; best effort.
func syncFS(dir string) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	_ = unix.Syncfs(fd)
	_ = unix.Close(fd)
}
