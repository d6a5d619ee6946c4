package e2b

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/e2b/envdpb/filesystem"
	"github.com/airlock-sandbox/airlock/internal/guest"
)

const (
	// maxWatchers bounds the polling watchers of one sandbox.
	maxWatchers = 16
	// maxWatcherEvents bounds the events a polling watcher holds between
	// polls; beyond it the oldest are dropped (and the watcher says so in
	// the next poll's error).
	maxWatcherEvents = 10000
	// watcherIdle ends a polling watcher nobody polled for this long.
	watcherIdle = 5 * time.Minute
)

// eventTypes maps airlock's file operations to E2B's event types.
var eventTypes = map[guest.FileOp]filesystem.EventType{
	guest.OpCreate: filesystem.EventType_EVENT_TYPE_CREATE,
	guest.OpWrite:  filesystem.EventType_EVENT_TYPE_WRITE,
	guest.OpRemove: filesystem.EventType_EVENT_TYPE_REMOVE,
	guest.OpRename: filesystem.EventType_EVENT_TYPE_RENAME,
	guest.OpChmod:  filesystem.EventType_EVENT_TYPE_CHMOD,
}

func fsEvent(ev guest.FileEvent) (*filesystem.FilesystemEvent, bool) {
	t, ok := eventTypes[ev.Op]
	return &filesystem.FilesystemEvent{Name: ev.Name, Type: t}, ok
}

// WatchDir streams the changes under a directory as envd does: start
// first, then one filesystem event per change, keepalives while idle.
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	t, _ := targetOf(ctx)
	p, err := rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	if err := f.checkWatchable(ctx, t, p); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex // stream.Send from the watch and the keepalives
	send := func(m *filesystem.WatchDirResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(m)
	}
	var sendErr error
	started := make(chan struct{})
	go func() {
		tick := time.NewTicker(keepaliveOf(req.Header()))
		defer tick.Stop()
		select {
		case <-started:
		case <-ctx.Done():
			return
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}})
			}
		}
	}()
	err = f.h.cfg.Files.WatchDir(ctx, t.c, t.id, p, req.Msg.GetRecursive(), func() {
		if sendErr = send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); sendErr == nil {
			close(started)
		} else {
			cancel()
		}
	}, func(ev guest.FileEvent) error {
		fe, ok := fsEvent(ev)
		if !ok {
			return nil
		}
		return send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: fe}})
	})
	switch {
	case sendErr != nil:
		return sendErr
	case err != nil:
		return fileRPCError(err, p)
	}
	return nil
}

// checkWatchable answers envd's errors for a path that is not a directory
// before a watch starts.
func (f *filesystemService) checkWatchable(ctx context.Context, t target, p string) error {
	fi, err := f.h.cfg.Files.StatFile(ctx, t.c, t.id, p)
	if err != nil {
		return fileRPCError(err, p)
	}
	if fi.Type != guest.FileDirectory {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is not a directory", p))
	}
	return nil
}

// watcher is a polling watcher (the Python SDK's sync watch_dir): a
// watch that runs in this server and keeps its events until polled.
type watcher struct {
	sandboxID string
	cancel    context.CancelFunc

	mu      sync.Mutex
	events  []*filesystem.FilesystemEvent
	dropped int
	err     error // the watch ended with this
	polled  time.Time
}

// watchers are the polling watchers of this server, by id.
type watchers struct {
	mu   sync.Mutex
	byID map[string]*watcher
}

func (ws *watchers) get(sandboxID, id string) (*watcher, bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w, ok := ws.byID[id]
	if !ok || w.sandboxID != sandboxID {
		return nil, false
	}
	return w, true
}

func (ws *watchers) remove(id string) {
	ws.mu.Lock()
	w := ws.byID[id]
	delete(ws.byID, id)
	ws.mu.Unlock()
	if w != nil {
		w.cancel()
	}
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	t, _ := targetOf(ctx)
	p, err := rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if err := f.checkWatchable(ctx, t, p); err != nil {
		return nil, err
	}
	ws := &f.watchers
	ws.mu.Lock()
	n := 0
	for _, w := range ws.byID {
		if w.sandboxID == t.id {
			n++
		}
	}
	ws.mu.Unlock()
	if n >= maxWatchers {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("at most %d watchers per sandbox; remove one first", maxWatchers))
	}
	var b [10]byte
	_, _ = rand.Read(b[:])
	id := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
	// The watch outlives this request: it runs until removed, idle or
	// ended by the sandbox.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &watcher{sandboxID: t.id, cancel: cancel, polled: time.Now()}
	started := make(chan error, 1)
	go func() {
		err := f.h.cfg.Files.WatchDir(wctx, t.c, t.id, p, req.Msg.GetRecursive(), func() { started <- nil }, func(ev guest.FileEvent) error {
			fe, ok := fsEvent(ev)
			if !ok {
				return nil
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			if len(w.events) == maxWatcherEvents {
				w.events, w.dropped = w.events[1:], w.dropped+1
			}
			w.events = append(w.events, fe)
			if time.Since(w.polled) > watcherIdle {
				return errors.New("nobody polled the watcher")
			}
			return nil
		})
		if err == nil {
			err = errors.New("the watch ended")
		}
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
		select {
		case started <- err:
		default:
		}
	}()
	select {
	case err := <-started:
		if err != nil {
			cancel()
			return nil, fileRPCError(err, p)
		}
	case <-ctx.Done():
		cancel()
		return nil, rpcError(ctx.Err())
	}
	ws.mu.Lock()
	if ws.byID == nil {
		ws.byID = map[string]*watcher{}
	}
	ws.byID[id] = w
	ws.mu.Unlock()
	// An idle watcher goes even when its directory is quiet.
	go func() {
		tick := time.NewTicker(watcherIdle / 5)
		defer tick.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-tick.C:
				w.mu.Lock()
				idle := time.Since(w.polled) > watcherIdle
				w.mu.Unlock()
				if idle {
					ws.remove(id)
					return
				}
			}
		}
	}()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	t, _ := targetOf(ctx)
	w, ok := f.watchers.get(t.id, req.Msg.GetWatcherId())
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("watcher not found"))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.polled = time.Now()
	evs, dropped, werr := w.events, w.dropped, w.err
	w.events, w.dropped = nil, 0
	if dropped > 0 {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%d events were dropped: poll more often", dropped))
	}
	if len(evs) == 0 && werr != nil {
		f.watchers.remove(req.Msg.GetWatcherId())
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("the watcher ended: %v", werr))
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	t, _ := targetOf(ctx)
	if _, ok := f.watchers.get(t.id, req.Msg.GetWatcherId()); !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("watcher not found"))
	}
	f.watchers.remove(req.Msg.GetWatcherId())
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
