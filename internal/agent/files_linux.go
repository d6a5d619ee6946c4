package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"os"
	"path"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
)

const (
	// readChunk is the data size of one Read response.
	readChunk = 256 << 10
	// defaultMaxEntries and maxEntries bound List.
	defaultMaxEntries = 10000
	maxEntries        = 100000
	// maxListDepth bounds List's depth.
	maxListDepth = 64
	// tempPrefix starts the names of Write's temporary files.
	tempPrefix = ".airlock-tmp-"
)

// fileService implements FileService on the agent's own root.
type fileService struct {
	log   *slog.Logger
	users userDB
}

var _ agentv1connect.FileServiceHandler = (*fileService)(nil)

func (f *fileService) Stat(_ context.Context, req *connect.Request[agentv1.StatRequest]) (*connect.Response[agentv1.StatResponse], error) {
	p := req.Msg.GetPath()
	if err := checkPath(p); err != nil {
		return nil, err
	}
	info, err := lstatInfo(p)
	if err != nil {
		return nil, sysError("stat", err)
	}
	return connect.NewResponse(&agentv1.StatResponse{Info: info}), nil
}

// List walks the tree breadth first, so that a truncated listing holds the
// shallowest entries, and returns the entries sorted by path. Symlinks are
// listed, never followed (except the listed path itself).
func (f *fileService) List(ctx context.Context, req *connect.Request[agentv1.ListRequest]) (*connect.Response[agentv1.ListResponse], error) {
	root := req.Msg.GetPath()
	if err := checkPath(root); err != nil {
		return nil, err
	}
	depth := min(max(int(req.Msg.GetDepth()), 1), maxListDepth)
	limit := int(req.Msg.GetMaxEntries())
	if limit <= 0 {
		limit = defaultMaxEntries
	}
	limit = min(limit, maxEntries)

	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		return nil, sysError("stat", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, preconditionf("not a directory")
	}
	resp := &agentv1.ListResponse{}
	level := []string{root}
walk:
	for d := 1; d <= depth && len(level) > 0; d++ {
		var next []string
		for _, dir := range level {
			if err := ctx.Err(); err != nil {
				return nil, connect.NewError(connect.CodeCanceled, err)
			}
			ents, err := os.ReadDir(dir)
			if err != nil {
				if dir == root {
					return nil, sysError("read directory", err)
				}
				continue // unreadable subdirectory: skip it
			}
			for _, e := range ents {
				if len(resp.Entries) == limit {
					resp.Truncated = true
					break walk
				}
				p := path.Join(dir, e.Name())
				info, err := lstatInfo(p)
				if err != nil {
					continue // vanished meanwhile
				}
				resp.Entries = append(resp.Entries, info)
				if d < depth && info.GetType() == agentv1.FileType_FILE_TYPE_DIRECTORY {
					next = append(next, p)
				}
			}
		}
		level = next
	}
	slices.SortFunc(resp.Entries, func(a, b *agentv1.FileInfo) int { return strings.Compare(a.GetPath(), b.GetPath()) })
	return connect.NewResponse(resp), nil
}

func (f *fileService) Mkdir(_ context.Context, req *connect.Request[agentv1.MkdirRequest]) (*connect.Response[agentv1.MkdirResponse], error) {
	p := req.Msg.GetPath()
	if err := checkPath(p); err != nil {
		return nil, err
	}
	mode := req.Msg.GetMode() & 0o7777
	if mode == 0 {
		mode = 0o755
	}
	if req.Msg.GetParents() {
		if err := mkdirAll(path.Dir(p)); err != nil {
			return nil, sysError("mkdir", err)
		}
	}
	if err := unix.Mkdir(p, mode); err != nil {
		if errors.Is(err, unix.EEXIST) && req.Msg.GetParents() {
			var st unix.Stat_t
			if unix.Stat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				return connect.NewResponse(&agentv1.MkdirResponse{}), nil
			}
		}
		return nil, sysError("mkdir", err)
	}
	// The agent's umask applies to mkdir(2); set exactly what was asked.
	if err := unix.Chmod(p, mode); err != nil {
		return nil, sysError("chmod", err)
	}
	return connect.NewResponse(&agentv1.MkdirResponse{}), nil
}

// mkdirAll creates dir and its missing parents with mode 0755.
func mkdirAll(dir string) error {
	return os.MkdirAll(dir, 0o755)
}

func (f *fileService) Remove(_ context.Context, req *connect.Request[agentv1.RemoveRequest]) (*connect.Response[agentv1.RemoveResponse], error) {
	p := req.Msg.GetPath()
	if err := checkPath(p); err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, invalidf("refusing to remove /")
	}
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return nil, sysError("remove", err)
	}
	var err error
	if req.Msg.GetRecursive() {
		err = os.RemoveAll(p)
	} else {
		err = os.Remove(p)
	}
	if err != nil {
		return nil, sysError("remove", err)
	}
	return connect.NewResponse(&agentv1.RemoveResponse{}), nil
}

// Read streams a regular file. The final component is not followed, and the
// file is opened non-blocking and checked with fstat, so a FIFO or device
// can neither hang nor be read.
func (f *fileService) Read(ctx context.Context, req *connect.Request[agentv1.ReadRequest], stream *connect.ServerStream[agentv1.ReadResponse]) error {
	p := req.Msg.GetPath()
	if err := checkPath(p); err != nil {
		return err
	}
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if errors.Is(err, unix.ELOOP) {
		return preconditionf("not a regular file (symlink)")
	}
	if err != nil {
		return sysError("open", err)
	}
	file := os.NewFile(uintptr(fd), "file")
	defer file.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return sysError("stat", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return preconditionf("not a regular file")
	}
	if err := stream.Send(&agentv1.ReadResponse{Msg: &agentv1.ReadResponse_Info{Info: infoFromStat(p, &st, "")}}); err != nil {
		return err
	}
	buf := make([]byte, readChunk)
	for {
		n, err := io.ReadFull(file, buf)
		if n > 0 {
			if err := stream.Send(&agentv1.ReadResponse{Msg: &agentv1.ReadResponse_Data{Data: buf[:n]}}); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		if err != nil {
			return sysError("read", err)
		}
		if err := ctx.Err(); err != nil {
			return connect.NewError(connect.CodeCanceled, err)
		}
	}
}

// Write receives a file into a temporary file next to the target and
// renames it over the target only when the stream ended cleanly.
func (f *fileService) Write(_ context.Context, stream *connect.ClientStream[agentv1.WriteRequest]) (*connect.Response[agentv1.WriteResponse], error) {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, invalidf("write stream has no header")
	}
	hdr := stream.Msg().GetHeader()
	if hdr == nil {
		return nil, invalidf("the first write message must be header")
	}
	p := hdr.GetPath()
	if err := checkPath(p); err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, invalidf("cannot write /")
	}
	mode := hdr.GetMode() & 0o7777
	if mode == 0 {
		mode = 0o644
	}
	id, err := f.users.resolve(hdr.GetUser())
	if err != nil {
		return nil, err
	}
	dir := path.Dir(p)
	if hdr.GetParents() {
		if err := mkdirAll(dir); err != nil {
			return nil, sysError("mkdir", err)
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil, preconditionf("target is a directory")
	}

	tmp, tmpPath, err := createTemp(dir)
	if err != nil {
		return nil, sysError("create", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = tmp.Close()
			_ = unix.Unlink(tmpPath)
		}
	}()
	var written uint64
	for stream.Receive() {
		m := stream.Msg()
		if m.GetHeader() != nil {
			return nil, invalidf("write stream has a second header")
		}
		n, err := tmp.Write(m.GetData())
		written += uint64(n)
		if err != nil {
			return nil, sysError("write", err)
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err // cancelled or broken: the target stays as it was
	}
	// chown before chmod: chown clears set-id bits. Without a user the file
	// belongs to the agent (root in the guest).
	if hdr.GetUser() != "" {
		if err := tmp.Chown(int(id.uid), int(id.gid)); err != nil {
			return nil, sysError("chown", err)
		}
	}
	if err := tmp.Chmod(os.FileMode(mode&0o777) | modeBits(mode)); err != nil {
		return nil, sysError("chmod", err)
	}
	if err := tmp.Sync(); err != nil {
		return nil, sysError("fsync", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, sysError("close", err)
	}
	if err := unix.Rename(tmpPath, p); err != nil {
		_ = unix.Unlink(tmpPath)
		ok = true // already closed and removed
		return nil, sysError("rename", err)
	}
	ok = true
	syncDir(dir)
	return connect.NewResponse(&agentv1.WriteResponse{BytesWritten: written}), nil
}

// modeBits converts the set-id and sticky bits of a raw mode to os.FileMode.
func modeBits(mode uint32) os.FileMode {
	var m os.FileMode
	if mode&unix.S_ISUID != 0 {
		m |= os.ModeSetuid
	}
	if mode&unix.S_ISGID != 0 {
		m |= os.ModeSetgid
	}
	if mode&unix.S_ISVTX != 0 {
		m |= os.ModeSticky
	}
	return m
}

// createTemp creates an empty, private temporary file in dir.
func createTemp(dir string) (*os.File, string, error) {
	for range 10 {
		var b [8]byte
		_, _ = rand.Read(b[:]) // getrandom(2) each call: safe after a snapshot restore
		p := path.Join(dir, tempPrefix+hex.EncodeToString(b[:]))
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return nil, "", err
		}
		return os.NewFile(uintptr(fd), p), p, nil
	}
	return nil, "", unix.EEXIST
}

// syncDir makes a rename durable; best effort.
func syncDir(dir string) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	_ = unix.Fsync(fd)
	_ = unix.Close(fd)
}

// lstatInfo describes p without following a final symlink.
func lstatInfo(p string) (*agentv1.FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return nil, err
	}
	target := ""
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		buf := make([]byte, maxPath)
		if n, err := unix.Readlink(p, buf); err == nil {
			target = string(buf[:n])
		}
	}
	return infoFromStat(p, &st, target), nil
}

func infoFromStat(p string, st *unix.Stat_t, target string) *agentv1.FileInfo {
	info := &agentv1.FileInfo{
		Path:          p,
		Name:          path.Base(p),
		Size:          uint64(st.Size),
		Mode:          st.Mode & 0o7777,
		MtimeUnixNano: st.Mtim.Nano(),
		Uid:           st.Uid,
		Gid:           st.Gid,
		SymlinkTarget: target,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		info.Type = agentv1.FileType_FILE_TYPE_REGULAR
	case unix.S_IFDIR:
		info.Type = agentv1.FileType_FILE_TYPE_DIRECTORY
	case unix.S_IFLNK:
		info.Type = agentv1.FileType_FILE_TYPE_SYMLINK
	default:
		info.Type = agentv1.FileType_FILE_TYPE_OTHER
	}
	return info
}
