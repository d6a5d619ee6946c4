package agent

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

const (
	// maxWatches bounds concurrent watches (each is an inotify instance,
	// of which a user has 128 by default).
	maxWatches = 32
	// maxWatchedDirs bounds the directories one recursive watch covers
	// (inotify watches, 8192 per user by default).
	maxWatchedDirs = 4096
)

// watches counts the running watches.
var watches atomic.Int32

func (f *fileService) Rename(_ context.Context, req *connect.Request[agentv1.RenameRequest]) (*connect.Response[agentv1.RenameResponse], error) {
	from, to := req.Msg.GetFrom(), req.Msg.GetTo()
	if err := checkPath(from); err != nil {
		return nil, err
	}
	if err := checkPath(to); err != nil {
		return nil, err
	}
	if from == "/" || to == "/" {
		return nil, invalidf("cannot rename the root")
	}
	if err := os.Rename(from, to); err != nil {
		return nil, sysError("rename", err)
	}
	return connect.NewResponse(&agentv1.RenameResponse{}), nil
}

// Watch streams the changes under a directory. See FileService.Watch.
func (f *fileService) Watch(ctx context.Context, req *connect.Request[agentv1.WatchRequest], stream *connect.ServerStream[agentv1.WatchResponse]) error {
	root := req.Msg.GetPath()
	if err := checkPath(root); err != nil {
		return err
	}
	fi, err := os.Stat(root)
	if err != nil {
		return sysError("stat", err)
	}
	if !fi.IsDir() {
		return preconditionf("not a directory")
	}
	if watches.Add(1) > maxWatches {
		watches.Add(-1)
		return connect.NewError(connect.CodeResourceExhausted, errors.New("too many watches in this sandbox"))
	}
	defer watches.Add(-1)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return sysError("inotify", err)
	}
	defer w.Close()
	recursive := req.Msg.GetRecursive()
	dirs := 0
	add := func(dir string) error {
		if dirs == maxWatchedDirs {
			return connect.NewError(connect.CodeResourceExhausted, errors.New("the watch would cover too many directories"))
		}
		dirs++
		return w.Add(dir)
	}
	if err := add(root); err != nil {
		return sysError("watch", err)
	}
	if recursive {
		if err := addTree(root, add, nil); err != nil {
			return err
		}
	}
	if err := stream.Send(&agentv1.WatchResponse{Msg: &agentv1.WatchResponse_Started{Started: true}}); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-w.Errors:
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				return connect.NewError(connect.CodeResourceExhausted, errors.New("changes came faster than they could be reported"))
			}
			return sysError("watch", err)
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			rel, err := filepath.Rel(root, ev.Name)
			if err != nil || rel == "." || strings.HasPrefix(rel, "../") || !utf8.ValidString(rel) {
				continue // outside, or a name a proto string cannot carry
			}
			send := func(name string, op agentv1.FileOp) error {
				return stream.Send(&agentv1.WatchResponse{Msg: &agentv1.WatchResponse_Event{Event: &agentv1.FileEvent{Name: name, Op: op}}})
			}
			for _, op := range fileOps(ev.Op) {
				if err := send(rel, op); err != nil {
					return err
				}
			}
			if recursive && ev.Has(fsnotify.Create) {
				// A new directory is watched too. What was made in it
				// before its watch was in place is reported as created.
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					if err := add(ev.Name); err != nil {
						return sysError("watch", err)
					}
					var found []string
					if err := addTree(ev.Name, add, func(p string) { found = append(found, p) }); err != nil {
						return err
					}
					for _, p := range found {
						if r, err := filepath.Rel(root, p); err == nil && utf8.ValidString(r) {
							if err := send(r, agentv1.FileOp_FILE_OP_CREATE); err != nil {
								return err
							}
						}
					}
				}
			}
		}
	}
}

// addTree adds every directory below root (not root itself), and calls
// found, if set, for every entry below root.
func addTree(root string, add func(string) error, found func(string)) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable: not watched
		}
		if p == root {
			return nil
		}
		if found != nil {
			found(p)
		}
		if !d.IsDir() {
			return nil
		}
		if err := add(p); err != nil {
			if ce, ok := errors.AsType[*connect.Error](err); ok {
				return ce
			}
			return nil // vanished meanwhile
		}
		return nil
	})
}

// fileOps maps an inotify event's operations, in a stable order.
func fileOps(op fsnotify.Op) []agentv1.FileOp {
	var out []agentv1.FileOp
	for _, m := range []struct {
		op fsnotify.Op
		to agentv1.FileOp
	}{
		{fsnotify.Create, agentv1.FileOp_FILE_OP_CREATE},
		{fsnotify.Write, agentv1.FileOp_FILE_OP_WRITE},
		{fsnotify.Remove, agentv1.FileOp_FILE_OP_REMOVE},
		{fsnotify.Rename, agentv1.FileOp_FILE_OP_RENAME},
		{fsnotify.Chmod, agentv1.FileOp_FILE_OP_CHMOD},
	} {
		if op.Has(m.op) {
			out = append(out, m.to)
		}
	}
	return out
}
