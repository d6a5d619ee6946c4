package airlock_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

func TestRunCode(t *testing.T) {
	t.Parallel()
	c, _ := newTestClient(t)
	ctx := t.Context()
	sb, err := c.Create(ctx, airlock.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunCode(ctx, sb.ID, airlock.CodeRequest{Code: "x = 21"}, airlock.CodeHandlers{}); err != nil {
		t.Fatal(err)
	}
	var streamed []byte
	var results int
	ex, err := c.RunCode(ctx, sb.ID, airlock.CodeRequest{Code: "print(hi)\nplot()\nx * 2", Timeout: 1500 * time.Millisecond}, airlock.CodeHandlers{
		OnStdout: func(p []byte) { streamed = append(streamed, p...) },
		OnResult: func(airlock.Result) { results++ },
	})
	if err != nil {
		t.Fatal(err)
	}
	if ex.Text() != "42" || string(ex.Stdout) != "hi\n" || string(streamed) != "hi\n" || results != 2 || ex.Context != "python-default" {
		t.Fatalf("execution %+v", ex)
	}
	if !bytes.Equal(ex.Results[0].Data["image/png"], fakePNG) || ex.Results[0].Main {
		t.Fatalf("png result %+v", ex.Results[0])
	}
	var gotErr *airlock.CodeError
	ex, err = c.RunCode(ctx, sb.ID, airlock.CodeRequest{Code: "1/0"}, airlock.CodeHandlers{OnError: func(e *airlock.CodeError) { gotErr = e }})
	if err != nil || ex.Error == nil || ex.Error.Name != "ZeroDivisionError" || gotErr != ex.Error || len(ex.Error.Traceback) != 2 {
		t.Fatalf("1/0: %+v %v", ex, err)
	}
	ex, err = c.RunCode(ctx, sb.ID, airlock.CodeRequest{Code: "while True: pass", Timeout: 2 * time.Second}, airlock.CodeHandlers{})
	if err != nil || !ex.TimedOut {
		t.Fatalf("timeout: %+v %v", ex, err)
	}
	if _, err := c.RunCode(ctx, sb.ID, airlock.CodeRequest{Code: "1", Context: "nope"}, airlock.CodeHandlers{}); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("missing context: %v", err)
	}
	// Status lines go to OnStatus only; returned files are results with
	// File set.
	var statuses []string
	ex, err = c.RunCode(ctx, sb.ID, airlock.CodeRequest{Code: "cold\nprint(hi)", ReturnFiles: []string{"*.png"}}, airlock.CodeHandlers{
		OnStatus: func(s string) { statuses = append(statuses, s) },
	})
	if err != nil || len(statuses) != 1 || statuses[0] != "starting python context" || string(ex.Stdout) != "hi\n" {
		t.Fatalf("status: %q %+v %v", statuses, ex, err)
	}
	if len(ex.Results) != 1 || ex.Results[0].File != "*.png" || !bytes.Equal(ex.Results[0].Data["image/png"], fakePNG) {
		t.Fatalf("returned files: %+v", ex.Results)
	}
}

func TestContexts(t *testing.T) {
	t.Parallel()
	c, _ := newTestClient(t)
	ctx := t.Context()
	sb, err := c.Create(ctx, airlock.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cx, err := c.CreateContext(ctx, sb.ID, airlock.ContextOptions{ID: "js", Language: "javascript"})
	if err != nil || cx.ID != "js" || cx.Language != "javascript" {
		t.Fatalf("create %+v %v", cx, err)
	}
	list, err := c.ListContexts(ctx, sb.ID)
	if err != nil || len(list) != 1 || list[0].ID != "c1" || list[0].CreatedAt.IsZero() {
		t.Fatalf("list %+v %v", list, err)
	}
	if _, err := c.RestartContext(ctx, sb.ID, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := c.InterruptContext(ctx, sb.ID, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteContext(ctx, sb.ID, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteContext(ctx, sb.ID, "zz"); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("delete missing: %v", err)
	}
}
