package e2b

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlock-sandbox/airlock/internal/e2b/envdpb/filesystem"
	"github.com/airlock-sandbox/airlock/internal/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// filesystemService is envd's filesystem.Filesystem over airlock's file
// operations (which act as root: the user only resolves relative paths).
type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	h        *handler
	watchers watchers // polling watchers (CreateWatcher)
}

var _ filesystemconnect.FilesystemHandler = (*filesystemService)(nil)

// maxListDepth bounds ListDir's depth.
const maxListDepth = 16

// rpcPath resolves and checks the path of a filesystem RPC.
func rpcPath(hdr http.Header, p string) (string, error) {
	user, err := rpcUser(hdr)
	if err != nil {
		return "", rpcError(err)
	}
	gp, err := guestPath(p, user)
	if err != nil {
		return "", rpcError(err)
	}
	return gp, nil
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	t, _ := targetOf(ctx)
	p, err := rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	fi, err := f.h.cfg.Files.StatFile(ctx, t.c, t.id, p)
	if err != nil {
		return nil, fileRPCError(err, p)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: entryInfo(fi)}), nil
}

func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	t, _ := targetOf(ctx)
	p, err := rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	// envd answers already_exists for an existing directory (the SDK's
	// makeDir returns false) and makes the parents of a new one.
	switch fi, err := f.h.cfg.Files.StatFile(ctx, t.c, t.id, p); {
	case err == nil && fi.Type == guest.FileDirectory:
		return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("directory already exists: "+p))
	case err == nil:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("path exists and is not a directory: "+p))
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, fileRPCError(err, p)
	}
	if err := f.h.cfg.Files.Mkdir(ctx, t.c, t.id, p, true); err != nil {
		return nil, fileRPCError(err, p)
	}
	fi, err := f.h.cfg.Files.StatFile(ctx, t.c, t.id, p)
	if err != nil {
		return nil, fileRPCError(err, p)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: entryInfo(fi)}), nil
}

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	t, _ := targetOf(ctx)
	p, err := rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := max(req.Msg.GetDepth(), 1) // envd reads 0 as 1
	if depth > maxListDepth {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("depth is at most "+strconv.Itoa(maxListDepth)))
	}
	ls, err := f.h.cfg.Files.ListFiles(ctx, t.c, t.id, p, depth)
	if err != nil {
		return nil, fileRPCError(err, p)
	}
	out := &filesystem.ListDirResponse{}
	for _, e := range ls.Entries {
		if e.Path == p {
			continue
		}
		out.Entries = append(out.Entries, entryInfo(e))
	}
	return connect.NewResponse(out), nil
}

func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	t, _ := targetOf(ctx)
	p, err := rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	// envd removes recursively, and a missing path is not an error.
	if err := f.h.cfg.Files.RemoveFile(ctx, t.c, t.id, p, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, fileRPCError(err, p)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	t, _ := targetOf(ctx)
	src, err := rpcPath(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := rpcPath(req.Header(), req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if err := f.h.cfg.Files.Rename(ctx, t.c, t.id, src, dst); err != nil {
		return nil, fileRPCError(err, src)
	}
	fi, err := f.h.cfg.Files.StatFile(ctx, t.c, t.id, dst)
	if err != nil {
		return nil, fileRPCError(err, dst)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: entryInfo(fi)}), nil
}

// fileRPCError is a file error as envd's: a missing file is not_found
// with its path (the SDK's FileNotFoundError).
func fileRPCError(err error, p string) error {
	if errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, sandbox.ErrNoSandbox) {
		return connect.NewError(connect.CodeNotFound, errors.New("file not found: "+p))
	}
	return rpcError(err)
}

// entryInfo is a guest file as envd describes it.
func entryInfo(fi guest.FileInfo) *filesystem.EntryInfo {
	e := &filesystem.EntryInfo{
		Name: fi.Name, Path: fi.Path, Size: int64(fi.Size), Mode: fi.Mode & 0o777,
		Owner: account(fi.UID), Group: account(fi.GID), ModifiedTime: timestamppb.New(fi.Mtime),
	}
	mode := fs.FileMode(fi.Mode & 0o777)
	switch fi.Type {
	case guest.FileRegular:
		e.Type = filesystem.FileType_FILE_TYPE_FILE
	case guest.FileDirectory:
		e.Type, mode = filesystem.FileType_FILE_TYPE_DIRECTORY, mode|fs.ModeDir
	case guest.FileSymlink:
		e.Type, mode = filesystem.FileType_FILE_TYPE_SYMLINK, mode|fs.ModeSymlink
		target := fi.SymlinkTarget
		e.SymlinkTarget = &target
	default:
		// Devices, sockets, fifos: E2B has no type for them; the SDK
		// drops an unspecified type from lists, so call them files.
		e.Type = filesystem.FileType_FILE_TYPE_FILE
		mode |= fs.ModeIrregular
	}
	e.Permissions = mode.String()
	return e
}

// account names a uid or gid: root, else the number (the host does not
// read the guest's passwd).
func account(id uint32) string {
	if id == 0 {
		return "root"
	}
	return strconv.FormatUint(uint64(id), 10)
}
