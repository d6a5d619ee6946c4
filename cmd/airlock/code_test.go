package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/runtime/fake"
)

func TestCodePrinter(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	dir := t.TempDir()
	p := &codePrinter{stdout: &out, stderr: &errb, out: dir}
	for _, ev := range []guest.CodeEvent{
		{Kind: guest.EventStdout, Data: []byte("hi\n")},
		{Kind: guest.EventResult, Result: &guest.CodeResult{Data: map[string][]byte{"image/png": fake.FakePNG, "text/plain": []byte("<Figure>")}}},
		{Kind: guest.EventResult, Result: &guest.CodeResult{Data: map[string][]byte{"text/plain": []byte("42")}, Main: true}},
		{Kind: guest.EventError, Error: &guest.CodeError{Name: "ZeroDivisionError", Value: "division by zero", Traceback: []string{"Traceback"}}},
		{Kind: guest.EventEnd, End: &guest.CodeEnd{}},
	} {
		if err := p.event(ev); err != nil {
			t.Fatal(err)
		}
	}
	if out.String() != "hi\n42\n" {
		t.Fatalf("stdout %q", out.String())
	}
	if b, err := os.ReadFile(filepath.Join(dir, "result-1.png")); err != nil || !bytes.Equal(b, fake.FakePNG) {
		t.Fatalf("png: %v", err)
	}
	if !strings.Contains(errb.String(), "ZeroDivisionError: division by zero") {
		t.Fatalf("stderr %q", errb.String())
	}
	var ee *exitError
	if err := p.exit(); !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("exit %v", err)
	}
	// Without --out: a note; a timeout exits 124.
	errb.Reset()
	p = &codePrinter{stdout: &out, stderr: &errb}
	_ = p.event(guest.CodeEvent{Kind: guest.EventResult, Result: &guest.CodeResult{Data: map[string][]byte{"image/png": fake.FakePNG}}})
	_ = p.event(guest.CodeEvent{Kind: guest.EventEnd, End: &guest.CodeEnd{TimedOut: true}})
	if !strings.Contains(errb.String(), "use --out DIR to save") {
		t.Fatalf("note %q", errb.String())
	}
	if err := p.exit(); !errors.As(err, &ee) || ee.code != 124 {
		t.Fatalf("timeout exit %v", err)
	}
}

// TestCodePrinterStatusAndFiles: status lines go to stderr only with
// progress (never to stdout); a returned file is saved and named, its
// guest path escaped.
func TestCodePrinterStatusAndFiles(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	dir := t.TempDir()
	for _, progress := range []bool{false, true} {
		out.Reset()
		errb.Reset()
		p := &codePrinter{stdout: &out, stderr: &errb, out: dir, progress: progress}
		for _, ev := range []guest.CodeEvent{
			{Kind: guest.EventStatus, Status: "starting python context"},
			{Kind: guest.EventStatus, Status: "still starting python context (5s)\x1b[2J"},
			{Kind: guest.EventStdout, Data: []byte("hi\n")},
			{Kind: guest.EventResult, Result: &guest.CodeResult{Data: map[string][]byte{"image/png": fake.FakePNG}, File: "plots/a\x1b[31m.png"}},
		} {
			if err := p.event(ev); err != nil {
				t.Fatal(err)
			}
		}
		if out.String() != "hi\n" {
			t.Fatalf("progress %v: stdout %q", progress, out.String())
		}
		hasStatus := strings.Contains(errb.String(), "airlock: starting python context\nairlock: still starting python context (5s)\\x1b[2J\n")
		if hasStatus != progress {
			t.Fatalf("progress %v: stderr %q", progress, errb.String())
		}
		if !strings.Contains(errb.String(), "[image/png plots/a\\x1b[31m.png saved to "+dir) {
			t.Fatalf("progress %v: file note %q", progress, errb.String())
		}
	}
}

func TestPrintContextsDead(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	cs := []contextView{localContext(guest.ContextInfo{ID: "default-python", Language: "python", State: "dead", IsDefault: true, Cwd: "/root",
		Exit: &guest.ContextExit{Code: -1, Signal: 9, OOMKilled: true}})}
	if err := printContexts(&b, cs, false); err != nil || !strings.Contains(b.String(), "dead (out of memory; the next run restarts it)") {
		t.Fatalf("table: %q %v", b.String(), err)
	}
	b.Reset()
	if err := printContexts(&b, cs, true); err != nil || !strings.Contains(b.String(), `"exit": {
      "reason": "out of memory",
      "code": -1,
      "signal": 9,
      "oom_killed": true
    }`) {
		t.Fatalf("json: %s %v", b.String(), err)
	}
}
