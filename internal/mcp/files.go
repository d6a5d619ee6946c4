package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"path"
	"strings"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
)

// File tools act inside a sandbox only: paths are guest paths, checked
// here and again by the guest agent. No tool touches a host file.
const (
	defaultReadBytes = 256 << 10
	maxReadBytes     = 4 << 20
	maxWriteBytes    = 4 << 20 // decoded content of one file_write
	maxListDepth     = 5
)

// guestPath checks a sandbox path: absolute, at most 4096 bytes, no NUL.
func guestPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") || len(p) > 4096 || strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("%w: path must be an absolute path inside the sandbox (e.g. /root/data.csv)", errdefs.ErrInvalid)
	}
	return path.Clean(p), nil
}

type fileReadIn struct {
	Path      string `json:"path" jsonschema:"absolute path inside the sandbox"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"sandbox (default: this session's sandbox)"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"auto (default: text if the file is UTF-8, else base64), text or base64"`
	MaxBytes  int    `json:"max_bytes,omitempty" jsonschema:"read at most this many bytes (default 262144, at most 4194304)"`
}

// errCapped stops a read at its cap.
var errCapped = errors.New("read cap reached")

type capWriter struct {
	buf   bytes.Buffer
	limit int
}

func (w *capWriter) Write(p []byte) (int, error) {
	if room := w.limit - w.buf.Len(); len(p) > room {
		w.buf.Write(p[:room])
		return room, errCapped
	}
	return w.buf.Write(p)
}

func (t *tools) fileRead(ctx context.Context, in fileReadIn) (*sdk.CallToolResult, error) {
	p, err := guestPath(in.Path)
	if err != nil {
		return nil, err
	}
	if in.MaxBytes < 0 || in.MaxBytes > maxReadBytes {
		return nil, fmt.Errorf("%w: max_bytes must be between 0 and %d", errdefs.ErrInvalid, maxReadBytes)
	}
	switch in.Encoding {
	case "", "auto", "text", "base64":
	default:
		return nil, fmt.Errorf("%w: encoding must be auto, text or base64", errdefs.ErrInvalid)
	}
	limit := in.MaxBytes
	if limit == 0 {
		limit = defaultReadBytes
	}
	ctx, cancel := context.WithTimeout(ctx, t.h.cfg.DefaultTimeout)
	defer cancel()
	id, err := t.s.target(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	w := &capWriter{limit: limit}
	var size uint64
	_, err = t.h.cfg.Service.ReadFile(ctx, t.s.caller(), id, p, w, func(fi guest.FileInfo) { size = fi.Size })
	capped := errors.Is(err, errCapped)
	if err != nil && !capped {
		return nil, err
	}
	data := w.buf.Bytes()
	note := ""
	if capped || uint64(len(data)) < size {
		note = fmt.Sprintf("\n[truncated: read the first %d of %d bytes; raise max_bytes (at most %d) or read parts with exec]", len(data), size, maxReadBytes)
	}
	enc := in.Encoding
	if enc == "" || enc == "auto" {
		enc = "text"
		if !utf8.Valid(data) || bytes.IndexByte(data, 0) >= 0 {
			enc = "base64"
		}
	}
	res := &sdk.CallToolResult{}
	if enc == "text" {
		res.Content = append(res.Content, &sdk.TextContent{Text: strings.ToValidUTF8(string(data), "\uFFFD") + note})
	} else {
		res.Content = append(res.Content, &sdk.TextContent{Text: fmt.Sprintf("base64 of %s (%d bytes):\n%s%s", p, len(data), base64.StdEncoding.EncodeToString(data), note)})
		if mime := imageMIME(data); mime != "" && !capped {
			res.Content = append(res.Content, &sdk.ImageContent{Data: data, MIMEType: mime})
		}
	}
	return res, nil
}

func imageMIME(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")):
		return "image/png"
	case bytes.HasPrefix(b, []byte("\xff\xd8\xff")):
		return "image/jpeg"
	}
	return ""
}

type fileWriteIn struct {
	Path      string `json:"path" jsonschema:"absolute path inside the sandbox"`
	Content   string `json:"content" jsonschema:"the file's content (text, or base64 with encoding base64)"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"text (default) or base64"`
	Mode      int    `json:"mode,omitempty" jsonschema:"permission bits as a number, e.g. 493 for 0755 (default 420 = 0644)"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"sandbox (default: this session's sandbox)"`
}

func (t *tools) fileWrite(ctx context.Context, in fileWriteIn) (*sdk.CallToolResult, error) {
	p, err := guestPath(in.Path)
	if err != nil {
		return nil, err
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "text":
	case "base64":
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, fmt.Errorf("%w: content is not valid base64", errdefs.ErrInvalid)
		}
	default:
		return nil, fmt.Errorf("%w: encoding must be text or base64", errdefs.ErrInvalid)
	}
	if len(data) > maxWriteBytes {
		return nil, fmt.Errorf("%w: content is larger than %d bytes", errdefs.ErrInvalid, maxWriteBytes)
	}
	mode := uint32(0o644)
	if in.Mode != 0 {
		if in.Mode < 0 || in.Mode > 0o7777 {
			return nil, fmt.Errorf("%w: mode must be between 0 and 4095 (0o7777)", errdefs.ErrInvalid)
		}
		mode = uint32(in.Mode)
	}
	ctx, cancel := context.WithTimeout(ctx, t.h.cfg.DefaultTimeout)
	defer cancel()
	id, err := t.s.target(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	n, err := t.h.cfg.Service.WriteFile(ctx, t.s.caller(), id, p, mode, bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	return textResult(fmt.Sprintf("wrote %d bytes to %s in sandbox %s", n, p, id)), nil
}

type fileListIn struct {
	Path      string `json:"path" jsonschema:"absolute directory path inside the sandbox"`
	Depth     int    `json:"depth,omitempty" jsonschema:"levels to descend (default 1, at most 5)"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"sandbox (default: this session's sandbox)"`
}

func (t *tools) fileList(ctx context.Context, in fileListIn) (*sdk.CallToolResult, error) {
	p, err := guestPath(in.Path)
	if err != nil {
		return nil, err
	}
	if in.Depth < 0 || in.Depth > maxListDepth {
		return nil, fmt.Errorf("%w: depth must be between 0 and %d", errdefs.ErrInvalid, maxListDepth)
	}
	depth := max(in.Depth, 1)
	ctx, cancel := context.WithTimeout(ctx, t.h.cfg.DefaultTimeout)
	defer cancel()
	id, err := t.s.target(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	ls, err := t.h.cfg.Service.ListFiles(ctx, t.s.caller(), id, p, uint32(depth))
	if err != nil {
		return nil, err
	}
	out := newOutput(t.h.cfg.MaxOutputBytes)
	for _, e := range ls.Entries {
		typ := map[guest.FileType]string{guest.FileDirectory: "dir", guest.FileSymlink: "link", guest.FileOther: "other"}[e.Type]
		if typ == "" {
			typ = "file"
		}
		line := fmt.Sprintf("%-4s %10d %04o %s", typ, e.Size, e.Mode, e.Path)
		if e.SymlinkTarget != "" {
			line += " -> " + e.SymlinkTarget
		}
		_, _ = out.stdout.Write([]byte(line + "\n"))
	}
	status := fmt.Sprintf("%d entries", len(ls.Entries))
	if ls.Truncated {
		status += " (the guest's entry cap was reached: list a subdirectory)"
	}
	return textResult(out.text(status)), nil
}
