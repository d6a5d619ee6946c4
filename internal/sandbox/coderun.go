package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
)

// ContextProgress times the status events of a run that waits for a code
// context's interpreter to start (a Jupyter kernel takes seconds, tens of
// seconds without KVM).
type ContextProgress struct {
	// Delay is the wait before the first event (default 1 s): a start
	// that is quick, or fails at once, sends none, and its error is still
	// the request's.
	Delay time.Duration
	// Every is the period of the "still starting" events (default 5 s).
	Every time.Duration
}

// progress sends a run's status events while it waits for an interpreter.
// Its calls of fn and the run's are serialized (mu), so fn is never called
// concurrently. Its goroutine is ended and waited for by finish or stop.
type progress struct {
	fn           func(guest.CodeEvent) error
	lang         string
	delay, every time.Duration
	cancel       context.CancelFunc // of the run, when a status cannot be sent

	wg   sync.WaitGroup
	quit chan struct{} // closed by finish; nil until start

	mu   sync.Mutex
	done bool  // the wait is over: send no more
	err  error // fn's error on a status event
}

func (m *Manager) newProgress(fn func(guest.CodeEvent) error, lang string, cancel context.CancelFunc) *progress {
	p := &progress{fn: fn, lang: lang, delay: m.ContextProgress.Delay, every: m.ContextProgress.Every, cancel: cancel}
	if p.delay <= 0 {
		p.delay = time.Second
	}
	if p.every <= 0 {
		p.every = 5 * time.Second
	}
	return p
}

// start begins the wait: first is said after the delay, then "still
// starting LANG context (Ns)" every period, until finish.
func (p *progress) start(first string) {
	p.quit = make(chan struct{})
	t0 := time.Now()
	p.wg.Go(func() {
		t := time.NewTimer(p.delay)
		defer t.Stop()
		for n := 0; ; n++ {
			select {
			case <-p.quit:
				return
			case <-t.C:
			}
			msg := first
			if n > 0 {
				msg = fmt.Sprintf("still starting %s context (%ds)", p.lang, int(time.Since(t0).Round(time.Second)/time.Second))
			}
			p.mu.Lock()
			if p.done {
				p.mu.Unlock()
				return
			}
			err := p.fn(guest.CodeEvent{Kind: guest.EventStatus, Status: msg})
			if err != nil {
				p.err, p.done = err, true
			}
			p.mu.Unlock()
			if err != nil {
				p.cancel()
				return
			}
			t.Reset(p.every)
		}
	})
}

// finish ends the wait (idempotent) and returns the error of a status
// event that could not be sent.
func (p *progress) finish() error {
	p.mu.Lock()
	first := !p.done
	p.done = true
	err := p.err
	p.mu.Unlock()
	if first && p.quit != nil {
		close(p.quit)
	}
	p.wg.Wait()
	return err
}

// stop ends the goroutine whatever happened.
func (p *progress) stop() { _ = p.finish() }

// Limits of CodeRequest.ReturnFiles.
const (
	// MaxReturnPatterns caps the patterns of one run.
	MaxReturnPatterns = 8
	// MaxReturnPatternDepth caps the path segments a pattern matches
	// below its fixed directory.
	MaxReturnPatternDepth = 4
	// MaxReturnFiles caps the files one run returns.
	MaxReturnFiles = 16
	// MaxReturnFileBytes caps one returned file (a result value).
	MaxReturnFileBytes = guest.MaxResultValueBytes
	// MaxReturnTotalBytes caps the files of one run together.
	MaxReturnTotalBytes = 32 << 20
)

// returnMIME is the MIME type of each image file a run may return, by
// extension.
var returnMIME = map[string]string{
	".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
	".gif": "image/gif", ".svg": "image/svg+xml",
}

// ValidateRunCode checks a code request before it leaves the host: the
// request itself (guest.CodeRequest.Validate) and the ReturnFiles patterns
// that the manager reads after the run.
func ValidateRunCode(req guest.CodeRequest) error {
	if err := req.Validate(); err != nil {
		return err
	}
	return validateReturnFiles(req.ReturnFiles)
}

func validateReturnFiles(patterns []string) error {
	if len(patterns) > MaxReturnPatterns {
		return fmt.Errorf("%w: at most %d return_files patterns", errdefs.ErrInvalid, MaxReturnPatterns)
	}
	for _, p := range patterns {
		if p == "" || len(p) > 1024 || strings.IndexByte(p, 0) >= 0 {
			return fmt.Errorf("%w: a return_files pattern is empty, longer than 1024 bytes or holds NUL", errdefs.ErrInvalid)
		}
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("%w: return_files pattern %q: %v", errdefs.ErrInvalid, guest.Text(p, 128), err)
		}
		if _, rest := splitPattern("/", p); len(rest) > MaxReturnPatternDepth {
			return fmt.Errorf("%w: return_files pattern %q has more than %d levels of wildcards", errdefs.ErrInvalid, guest.Text(p, 128), MaxReturnPatternDepth)
		}
	}
	return nil
}

// splitPattern makes pattern absolute (relative to cwd) and splits it into
// its fixed directory and the segments below it, the first of which holds
// a wildcard (or is the file's name).
func splitPattern(cwd, pattern string) (dir string, rest []string) {
	if !path.IsAbs(pattern) {
		pattern = path.Join(cwd, pattern)
	}
	segs := strings.Split(strings.TrimPrefix(path.Clean(pattern), "/"), "/")
	i := 0
	for i < len(segs)-1 && !strings.ContainsAny(segs[i], `*?[\`) {
		i++
	}
	return "/" + path.Join(segs[:i]...), segs[i:]
}

// returnFiles finds the image files a run wrote that match its patterns:
// files listed after the run that were not listed before, or whose size
// or modification time changed (guest clocks are never compared with the
// host's). Each comes back as a result with File set, at most
// MaxReturnFiles of at most MaxReturnFileBytes, MaxReturnTotalBytes in
// all, and checked to be what its extension says; what is left out is
// said on stderr ("[airlock: ...]"). Guest paths are escaped in those
// lines; File holds the path as the guest named it.
type returnFiles struct {
	cwd    string
	globs  []glob
	seen   map[string]stamp // before the run, by path
	failed bool             // the listing before failed: nothing is known
}

type glob struct {
	dir  string
	rest string // path.Match pattern relative to dir
	n    int    // its segments
}

type stamp struct {
	size  uint64
	mtime time.Time
}

func newReturnFiles(cwd string, patterns []string) *returnFiles {
	r := &returnFiles{cwd: cwd, seen: map[string]stamp{}}
	for _, p := range patterns {
		dir, rest := splitPattern(cwd, p)
		r.globs = append(r.globs, glob{dir: dir, rest: path.Join(rest...), n: len(rest)})
	}
	return r
}

// list returns the regular files that match, by path; truncated says a
// listing hit the guest's entry cap.
func (r *returnFiles) list(ctx context.Context, sc *shimclient.Client) (map[string]stamp, bool, error) {
	out := map[string]stamp{}
	truncated := false
	for _, g := range r.globs {
		l, err := sc.ListFiles(ctx, g.dir, uint32(g.n))
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrFailedPrecondition) {
			continue // no such directory (yet)
		}
		if err != nil {
			return nil, false, err
		}
		truncated = truncated || l.Truncated
		for _, e := range l.Entries {
			rel, ok := strings.CutPrefix(e.Path, strings.TrimSuffix(g.dir, "/")+"/")
			if e.Type != guest.FileRegular || !ok {
				continue
			}
			if m, _ := path.Match(g.rest, rel); m {
				out[e.Path] = stamp{e.Size, e.Mtime}
			}
		}
	}
	return out, truncated, nil
}

// before records what the patterns match before the run.
func (r *returnFiles) before(ctx context.Context, sc *shimclient.Client) {
	seen, _, err := r.list(ctx, sc)
	if err != nil {
		r.failed = true
		return
	}
	r.seen = seen
}

// after sends the image files the run wrote as results, and notes on
// stderr what it left out.
func (r *returnFiles) after(ctx context.Context, sc *shimclient.Client, fn func(guest.CodeEvent) error) error {
	note := func(format string, args ...any) error {
		return fn(guest.CodeEvent{Kind: guest.EventStderr, Data: fmt.Appendf(nil, "[airlock: "+format+"]\n", args...)})
	}
	if r.failed {
		return note("return_files: the files could not be listed before the run")
	}
	now, truncated, err := r.list(ctx, sc)
	if err != nil {
		return note("return_files: the files could not be listed after the run")
	}
	if truncated {
		if err := note("return_files: a directory has more entries than one listing holds; some files may be missing"); err != nil {
			return err
		}
	}
	var written []string
	for p, st := range now {
		if old, ok := r.seen[p]; !ok || old != st {
			written = append(written, p)
		}
	}
	slices.Sort(written)
	sent, total := 0, 0
	for _, p := range written {
		name := p
		if rel, ok := strings.CutPrefix(p, strings.TrimSuffix(r.cwd, "/")+"/"); ok {
			name = rel
		}
		shown := guest.Text(name, 256)
		mime, ok := returnMIME[strings.ToLower(path.Ext(p))]
		if !ok {
			continue // not an image
		}
		size := now[p].size
		switch {
		case sent == MaxReturnFiles:
			if err := note("%s was not returned: a run returns at most %d files", shown, MaxReturnFiles); err != nil {
				return err
			}
			continue
		case size > MaxReturnFileBytes:
			if err := note("%s was not returned: it has %d bytes, more than the %d a file may have", shown, size, MaxReturnFileBytes); err != nil {
				return err
			}
			continue
		case total+int(size) > MaxReturnTotalBytes:
			if err := note("%s was not returned: the files of a run are capped at %d bytes in all", shown, MaxReturnTotalBytes); err != nil {
				return err
			}
			continue
		}
		var buf bytes.Buffer
		if _, err := sc.ReadFile(ctx, p, MaxReturnFileBytes, &buf, nil); err != nil {
			if ctx.Err() != nil {
				return err
			}
			if err := note("%s was not returned: it could not be read (%s)", shown, errdefs.Category(err)); err != nil {
				return err
			}
			continue
		}
		if !looksLike(mime, buf.Bytes()) {
			if err := note("%s was not returned: it is not a %s file", shown, mime); err != nil {
				return err
			}
			continue
		}
		sent++
		total += buf.Len()
		if err := fn(guest.CodeEvent{Kind: guest.EventResult, Result: &guest.CodeResult{
			Data: map[string][]byte{mime: buf.Bytes()}, File: strings.ToValidUTF8(name, "\uFFFD"),
		}}); err != nil {
			return err
		}
	}
	return nil
}

// looksLike checks a file's first bytes against its MIME type.
func looksLike(mime string, b []byte) bool {
	switch mime {
	case "image/png":
		return bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n"))
	case "image/jpeg":
		return bytes.HasPrefix(b, []byte{0xff, 0xd8, 0xff})
	case "image/gif":
		return bytes.HasPrefix(b, []byte("GIF87a")) || bytes.HasPrefix(b, []byte("GIF89a"))
	case "image/svg+xml":
		return utf8.Valid(b) && bytes.Contains(b, []byte("<svg"))
	}
	return false
}
