package shim

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2/shimv2connect"
)

// fileService serves the shim's FileService (proto/airlock/shim/v2) by
// mapping it to the guest's: paths are validated before the guest sees
// them, the guest's replies come through the host-side agent client (which
// caps message sizes), and its error text is bounded.
type fileService struct {
	agent *agentapi.Client
}

var _ shimv2connect.FileServiceHandler = fileService{}

// wireFileType maps the guest's file type to the shim's.
func wireFileType(t agentv1.FileType) shimv2.FileType {
	switch t {
	case agentv1.FileType_FILE_TYPE_REGULAR:
		return shimv2.FileType_FILE_TYPE_REGULAR
	case agentv1.FileType_FILE_TYPE_DIRECTORY:
		return shimv2.FileType_FILE_TYPE_DIRECTORY
	case agentv1.FileType_FILE_TYPE_SYMLINK:
		return shimv2.FileType_FILE_TYPE_SYMLINK
	case agentv1.FileType_FILE_TYPE_OTHER:
		return shimv2.FileType_FILE_TYPE_OTHER
	}
	return shimv2.FileType_FILE_TYPE_UNSPECIFIED
}

// wireFileInfo maps a guest FileInfo (nil stays nil).
func wireFileInfo(in *agentv1.FileInfo) *shimv2.FileInfo {
	if in == nil {
		return nil
	}
	return &shimv2.FileInfo{
		Path: in.GetPath(), Name: in.GetName(), Type: wireFileType(in.GetType()), Size: in.GetSize(), Mode: in.GetMode(),
		MtimeUnixNano: in.GetMtimeUnixNano(), Uid: in.GetUid(), Gid: in.GetGid(), SymlinkTarget: in.GetSymlinkTarget(),
	}
}

func checkPath(p string) error {
	if err := ValidateGuestPath(p); err != nil {
		return invalid(err)
	}
	return nil
}

func (f fileService) Stat(ctx context.Context, req *connect.Request[shimv2.StatFileRequest]) (*connect.Response[shimv2.StatFileResponse], error) {
	if err := checkPath(req.Msg.GetPath()); err != nil {
		return nil, err
	}
	resp, err := f.agent.Files.Stat(ctx, connect.NewRequest(&agentv1.StatRequest{Path: req.Msg.GetPath()}))
	if err != nil {
		return nil, relayErr("stat", err)
	}
	return connect.NewResponse(&shimv2.StatFileResponse{Info: wireFileInfo(resp.Msg.GetInfo())}), nil
}

func (f fileService) List(ctx context.Context, req *connect.Request[shimv2.ListFilesRequest]) (*connect.Response[shimv2.ListFilesResponse], error) {
	if err := checkPath(req.Msg.GetPath()); err != nil {
		return nil, err
	}
	resp, err := f.agent.Files.List(ctx, connect.NewRequest(&agentv1.ListRequest{Path: req.Msg.GetPath(), Depth: req.Msg.GetDepth()}))
	if err != nil {
		return nil, relayErr("list", err)
	}
	out := &shimv2.ListFilesResponse{Truncated: resp.Msg.GetTruncated(), Entries: make([]*shimv2.FileInfo, 0, len(resp.Msg.GetEntries()))}
	for _, e := range resp.Msg.GetEntries() {
		out.Entries = append(out.Entries, wireFileInfo(e))
	}
	return connect.NewResponse(out), nil
}

func (f fileService) Mkdir(ctx context.Context, req *connect.Request[shimv2.MkdirRequest]) (*connect.Response[shimv2.MkdirResponse], error) {
	if err := checkPath(req.Msg.GetPath()); err != nil {
		return nil, err
	}
	if _, err := f.agent.Files.Mkdir(ctx, connect.NewRequest(&agentv1.MkdirRequest{Path: req.Msg.GetPath(), Parents: req.Msg.GetParents(), Mode: req.Msg.GetMode()})); err != nil {
		return nil, relayErr("mkdir", err)
	}
	return connect.NewResponse(&shimv2.MkdirResponse{}), nil
}

func (f fileService) Remove(ctx context.Context, req *connect.Request[shimv2.RemoveFileRequest]) (*connect.Response[shimv2.RemoveFileResponse], error) {
	if err := checkPath(req.Msg.GetPath()); err != nil {
		return nil, err
	}
	if _, err := f.agent.Files.Remove(ctx, connect.NewRequest(&agentv1.RemoveRequest{Path: req.Msg.GetPath(), Recursive: req.Msg.GetRecursive()})); err != nil {
		return nil, relayErr("remove", err)
	}
	return connect.NewResponse(&shimv2.RemoveFileResponse{}), nil
}

func (f fileService) Read(ctx context.Context, req *connect.Request[shimv2.ReadFileRequest], out *connect.ServerStream[shimv2.ReadFileResponse]) error {
	if err := checkPath(req.Msg.GetPath()); err != nil {
		return err
	}
	in, err := f.agent.Files.Read(ctx, connect.NewRequest(&agentv1.ReadRequest{Path: req.Msg.GetPath()}))
	if err != nil {
		return relayErr("read", err)
	}
	defer in.Close()
	for in.Receive() {
		var msg *shimv2.ReadFileResponse
		switch m := in.Msg().GetMsg().(type) {
		case *agentv1.ReadResponse_Info:
			msg = &shimv2.ReadFileResponse{Msg: &shimv2.ReadFileResponse_Info{Info: wireFileInfo(m.Info)}}
		case *agentv1.ReadResponse_Data:
			msg = &shimv2.ReadFileResponse{Msg: &shimv2.ReadFileResponse_Data{Data: m.Data}}
		default:
			continue // unknown message from a newer or hostile agent
		}
		if err := out.Send(msg); err != nil {
			return err
		}
	}
	if err := in.Err(); err != nil {
		return relayErr("read", err)
	}
	return nil
}

func (f fileService) Write(ctx context.Context, in *connect.ClientStream[shimv2.WriteFileRequest]) (*connect.Response[shimv2.WriteFileResponse], error) {
	if !in.Receive() {
		return nil, invalid(fmt.Errorf("read write header: %w", in.Err()))
	}
	h := in.Msg().GetHeader()
	if h == nil {
		return nil, invalid(errors.New("first write message must be the header"))
	}
	if err := checkPath(h.GetPath()); err != nil {
		return nil, err
	}
	out := f.agent.Files.Write(ctx)
	if err := out.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Header{Header: &agentv1.WriteHeader{
		Path: h.GetPath(), Mode: h.GetMode(), Parents: h.GetParents(),
	}}}); err != nil {
		_, rerr := out.CloseAndReceive()
		return nil, relayErr("write", errors.Join(err, rerr))
	}
	for in.Receive() {
		data := in.Msg().GetData()
		if data == nil {
			continue
		}
		if err := out.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Data{Data: data}}); err != nil {
			break // the real error comes from CloseAndReceive
		}
	}
	if err := in.Err(); err != nil {
		// The client went away mid-upload: abandon so the guest keeps the
		// old file.
		return nil, relayErr("write", err)
	}
	resp, err := out.CloseAndReceive()
	if err != nil {
		return nil, relayErr("write", err)
	}
	return connect.NewResponse(&shimv2.WriteFileResponse{BytesWritten: resp.Msg.GetBytesWritten()}), nil
}

func (f fileService) Rename(ctx context.Context, req *connect.Request[shimv2.RenameFileRequest]) (*connect.Response[shimv2.RenameFileResponse], error) {
	for _, p := range []string{req.Msg.GetFrom(), req.Msg.GetTo()} {
		if err := checkPath(p); err != nil {
			return nil, err
		}
	}
	if err := f.agent.Require(agentapi.VersionWatch, "rename"); err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	if _, err := f.agent.Files.Rename(ctx, connect.NewRequest(&agentv1.RenameRequest{From: req.Msg.GetFrom(), To: req.Msg.GetTo()})); err != nil {
		return nil, relayErr("rename", err)
	}
	return connect.NewResponse(&shimv2.RenameFileResponse{}), nil
}

// Watch relays a guest watch. The guest's event names are checked before
// they go on: relative, clean, without NUL, at most 4096 bytes; an event
// that is not is dropped.
func (f fileService) Watch(ctx context.Context, req *connect.Request[shimv2.WatchFilesRequest], out *connect.ServerStream[shimv2.WatchFilesResponse]) error {
	if err := checkPath(req.Msg.GetPath()); err != nil {
		return err
	}
	if err := f.agent.Require(agentapi.VersionWatch, "watch"); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	in, err := f.agent.Files.Watch(ctx, connect.NewRequest(&agentv1.WatchRequest{Path: req.Msg.GetPath(), Recursive: req.Msg.GetRecursive()}))
	if err != nil {
		return relayErr("watch", err)
	}
	defer in.Close()
	for in.Receive() {
		var msg *shimv2.WatchFilesResponse
		switch m := in.Msg().GetMsg().(type) {
		case *agentv1.WatchResponse_Started:
			msg = &shimv2.WatchFilesResponse{Msg: &shimv2.WatchFilesResponse_Started{Started: true}}
		case *agentv1.WatchResponse_Event:
			name, op := m.Event.GetName(), shimv2.FileOp(m.Event.GetOp())
			if !validEventName(name) || op <= shimv2.FileOp_FILE_OP_UNSPECIFIED || op > shimv2.FileOp_FILE_OP_CHMOD {
				continue
			}
			msg = &shimv2.WatchFilesResponse{Msg: &shimv2.WatchFilesResponse_Event{Event: &shimv2.FileEvent{Name: name, Op: op}}}
		default:
			continue // unknown message from a newer or hostile agent
		}
		if err := out.Send(msg); err != nil {
			return err
		}
	}
	if err := in.Err(); err != nil {
		return relayErr("watch", err)
	}
	return nil
}

// validEventName reports whether a guest's watch event name is a clean
// relative path the host may pass on.
func validEventName(name string) bool {
	return name != "" && len(name) <= maxPathLen && !strings.HasPrefix(name, "/") && strings.IndexByte(name, 0) < 0 &&
		path.Clean(name) == name && name != ".." && !strings.HasPrefix(name, "../") && utf8.ValidString(name)
}

// WriteTar relays a tar stream into a guest directory, like Write: the
// path is checked here, the archive's names by the guest (the archive is
// the caller's, and the guest is where it lands).
func (f fileService) WriteTar(ctx context.Context, in *connect.ClientStream[shimv2.WriteTarRequest]) (*connect.Response[shimv2.WriteTarResponse], error) {
	if !in.Receive() {
		return nil, invalid(fmt.Errorf("read tar header: %w", in.Err()))
	}
	h := in.Msg().GetHeader()
	if h == nil {
		return nil, invalid(errors.New("first tar message must be the header"))
	}
	if err := checkPath(h.GetPath()); err != nil {
		return nil, err
	}
	if err := f.requireArchive(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := f.agent.Files.WriteTar(ctx)
	if err := out.Send(&agentv1.WriteTarRequest{Msg: &agentv1.WriteTarRequest_Header{Header: &agentv1.WriteTarHeader{Path: h.GetPath()}}}); err != nil {
		_, rerr := out.CloseAndReceive()
		return nil, relayErr("write tar", errors.Join(err, rerr))
	}
	for in.Receive() {
		data := in.Msg().GetData()
		if data == nil {
			continue
		}
		if err := out.Send(&agentv1.WriteTarRequest{Msg: &agentv1.WriteTarRequest_Data{Data: data}}); err != nil {
			break // the real error comes from CloseAndReceive
		}
	}
	if err := in.Err(); err != nil {
		// The client went away mid-archive: cancel, so the guest stops
		// instead of taking what came as the whole archive.
		cancel()
		_, _ = out.CloseAndReceive()
		return nil, relayErr("write tar", err)
	}
	resp, err := out.CloseAndReceive()
	if err != nil {
		return nil, relayErr("write tar", err)
	}
	return connect.NewResponse(&shimv2.WriteTarResponse{Entries: resp.Msg.GetEntries(), Bytes: resp.Msg.GetBytes()}), nil
}

// requireArchive refuses the tar RPCs for an agent that predates them,
// saying what to do about it.
func (f fileService) requireArchive() error {
	if err := f.agent.Require(agentapi.VersionArchive, "copying directories"); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("%w; update the guest: rerun `airlock setup` and create the sandbox again", err))
	}
	return nil
}

// ReadTar relays the guest's tar of a path. The bytes are passed on
// unread: they are guest data, capped by the shim client and extracted
// (if at all) by code that treats them as hostile.
func (f fileService) ReadTar(ctx context.Context, req *connect.Request[shimv2.ReadTarRequest], out *connect.ServerStream[shimv2.ReadTarResponse]) error {
	if err := checkPath(req.Msg.GetPath()); err != nil {
		return err
	}
	if err := f.requireArchive(); err != nil {
		return err
	}
	in, err := f.agent.Files.ReadTar(ctx, connect.NewRequest(&agentv1.ReadTarRequest{Path: req.Msg.GetPath()}))
	if err != nil {
		return relayErr("read tar", err)
	}
	defer in.Close()
	for in.Receive() {
		if err := out.Send(&shimv2.ReadTarResponse{Data: in.Msg().GetData()}); err != nil {
			return err
		}
	}
	if err := in.Err(); err != nil {
		return relayErr("read tar", err)
	}
	return nil
}
