package mcp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
)

// maxImageBytes caps one image of a run_code result; maxImages their count.
const (
	maxImageBytes = 4 << 20
	maxImages     = 8
)

type runCodeIn struct {
	Code      string `json:"code" jsonschema:"the code to run"`
	Language  string `json:"language,omitempty" jsonschema:"python (default), javascript or bash; ignored when context is given"`
	Context   string `json:"context,omitempty" jsonschema:"code context id (see context_create); default: the language's default context"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"sandbox to run in (default: this session's sandbox, created on first use)"`
	TimeoutS  int    `json:"timeout_s,omitempty" jsonschema:"interrupt the code after this many seconds (default 60); the context survives"`
	// ReturnFiles is CodeRequest.ReturnFiles.
	ReturnFiles []string `json:"return_files,omitempty" jsonschema:"glob patterns (*, ?, [...]) relative to the context's directory (/root) or absolute, e.g. [\"*.png\"]: the image files (png, jpg, gif, svg) the code wrote that match come back as images"`
}

func (t *tools) runCode(ctx context.Context, in runCodeIn) (*sdk.CallToolResult, error) {
	if err := guest.ValidateLanguage(in.Language); err != nil {
		return nil, err
	}
	ctx, cancel, id, d, err := t.begin(ctx, in.SandboxID, in.TimeoutS)
	if err != nil {
		return nil, err
	}
	defer cancel()
	limit := t.h.cfg.MaxOutputBytes
	out := newOutput(limit)
	var (
		results []string
		images  []sdk.Content
		imgNote []string
		cerr    *guest.CodeError
		end     guest.CodeEnd
		waiting string // the last status while the context started; "" once the run began
	)
	err = t.h.cfg.Service.RunCode(ctx, t.s.caller(), id, guest.CodeRequest{
		ContextID: in.Context, Language: in.Language, Code: in.Code,
		Timeout: d.Truncate(time.Millisecond), MaxOutputBytes: uint64(8 * limit),
		ReturnFiles: in.ReturnFiles,
	}, func(ev guest.CodeEvent) error {
		if ev.Kind == guest.EventStatus {
			waiting = ev.Status
			return nil
		}
		waiting = ""
		switch ev.Kind {
		case guest.EventStdout:
			_, _ = out.stdout.Write(ev.Data)
		case guest.EventStderr:
			_, _ = out.stderr.Write(ev.Data)
		case guest.EventResult:
			data := ev.Result.Data
			for _, mime := range []string{"image/png", "image/jpeg", "image/gif"} {
				if img, ok := data[mime]; ok {
					switch {
					case len(images) >= maxImages:
						imgNote = append(imgNote, fmt.Sprintf("[an image was dropped: at most %d per result]", maxImages))
					case len(img) > maxImageBytes:
						imgNote = append(imgNote, fmt.Sprintf("[a %d-byte %s was dropped: images are capped at %d bytes]", len(img), mime, maxImageBytes))
					default:
						images = append(images, &sdk.ImageContent{Data: img, MIMEType: mime})
					}
					break
				}
			}
			if f := ev.Result.File; f != "" {
				label := "an image"
				if _, ok := data["image/svg+xml"]; ok {
					label = "SVG text"
				}
				results = append(results, fmt.Sprintf("--- file %s (%s) ---", guest.Text(f, 256), label))
				if svg, ok := data["image/svg+xml"]; ok {
					results[len(results)-1] += "\n" + strings.ToValidUTF8(string(svg), "\uFFFD")
				}
				return nil
			}
			if txt, ok := data["text/plain"]; ok {
				label := "display"
				if ev.Result.Main {
					label = "result"
				}
				results = append(results, fmt.Sprintf("--- %s ---\n%s", label, strings.ToValidUTF8(string(txt), "\uFFFD")))
			}
		case guest.EventError:
			cerr = ev.Error
		case guest.EventEnd:
			end = *ev.End
		}
		return nil
	})
	if err != nil {
		if waiting != "" && (ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded)) {
			// The deadline passed before the interpreter was up: say so,
			// rather than that the call timed out.
			return errorResult(fmt.Sprintf("the call's deadline passed while the code context was starting (%s); the next call finds it up, or raise timeout_s", waiting)), nil
		}
		return nil, err
	}
	var status []string
	for _, r := range results {
		s, cut := out.take(r + "\n")
		status = append(status, strings.TrimSuffix(s, "\n"))
		if cut {
			status = append(status, "[result truncated: the tool result is capped]")
			break
		}
	}
	status = append(status, imgNote...)
	if cerr != nil {
		tb, _ := out.take(strings.Join(cerr.Traceback, "\n"))
		status = append(status, fmt.Sprintf("--- error ---\n%s: %s\n%s", cerr.Name, cerr.Value, tb))
	}
	if end.TimedOut {
		status = append(status, fmt.Sprintf("[timed out after %s: the code was interrupted; the context survives]", d))
	}
	if end.Truncated {
		status = append(status, "[output beyond the guest's cap was dropped]")
	}
	status = append(status, fmt.Sprintf("sandbox_id: %s\ncontext_id: %s\nexecution_count: %d\nduration_ms: %d",
		id, end.ContextID, end.ExecutionCount, end.Duration.Milliseconds()))
	res := &sdk.CallToolResult{Content: append([]sdk.Content{&sdk.TextContent{Text: out.text(strings.Join(status, "\n"))}}, images...)}
	res.IsError = cerr != nil || end.TimedOut
	return res, nil
}

type contextCreateIn struct {
	SandboxID string            `json:"sandbox_id,omitempty" jsonschema:"sandbox (default: this session's sandbox, created on first use)"`
	Language  string            `json:"language,omitempty" jsonschema:"python (default), javascript or bash"`
	ID        string            `json:"id,omitempty" jsonschema:"optional id: [a-z0-9][a-z0-9-]{0,62}; generated if empty"`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"working directory (default /root)"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
}

func (t *tools) contextCreate(ctx context.Context, in contextCreateIn) (*sdk.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(ctx, t.h.cfg.DefaultTimeout)
	defer cancel()
	id, err := t.s.target(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	req := guest.ContextSpec{Language: in.Language, ID: in.ID, Cwd: in.Cwd}
	for _, k := range sortedKeys(in.Env) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, fmt.Errorf("%w: env names must be non-empty without '=' or NUL", errdefs.ErrInvalid)
		}
		req.Env = append(req.Env, k+"="+in.Env[k])
	}
	info, err := t.h.cfg.Service.CreateContext(ctx, t.s.caller(), id, req)
	if err != nil {
		return nil, err
	}
	return jsonResult(map[string]any{"sandbox_id": id, "context": viewContext(info)})
}

type contextListIn struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"sandbox (default: this session's sandbox)"`
}

func (t *tools) contextList(ctx context.Context, in contextListIn) (*sdk.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(ctx, t.h.cfg.DefaultTimeout)
	defer cancel()
	id, err := t.s.target(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	infos, err := t.h.cfg.Service.ListContexts(ctx, t.s.caller(), id)
	if err != nil {
		return nil, err
	}
	out := []contextView{}
	for _, c := range infos {
		out = append(out, viewContext(c))
	}
	return jsonResult(map[string]any{"sandbox_id": id, "contexts": out})
}

type contextResetIn struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"sandbox (default: this session's sandbox)"`
	Context   string `json:"context" jsonschema:"the code context id (see context_list)"`
}

func (t *tools) contextReset(ctx context.Context, in contextResetIn) (*sdk.CallToolResult, error) {
	if in.Context == "" {
		return nil, fmt.Errorf("%w: context is required", errdefs.ErrInvalid)
	}
	ctx, cancel := context.WithTimeout(ctx, t.h.cfg.DefaultTimeout)
	defer cancel()
	id, err := t.s.target(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	info, err := t.h.cfg.Service.RestartContext(ctx, t.s.caller(), id, in.Context)
	if err != nil {
		return nil, err
	}
	return jsonResult(map[string]any{"sandbox_id": id, "context": viewContext(info)})
}

type contextView struct {
	ID        string    `json:"id"`
	Language  string    `json:"language"`
	Cwd       string    `json:"cwd,omitempty"`
	State     string    `json:"state"`
	IsDefault bool      `json:"is_default,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// Died says how a dead context ended ("killed by signal 9"); the next
	// run_code in it restarts it.
	Died string `json:"died,omitempty"`
}

func viewContext(c guest.ContextInfo) contextView {
	v := contextView{ID: c.ID, Language: c.Language, Cwd: c.Cwd, State: c.State,
		IsDefault: c.IsDefault, CreatedAt: c.CreatedAt.UTC()}
	if c.State == "dead" {
		v.Died = c.Exit.Reason()
	}
	return v
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
