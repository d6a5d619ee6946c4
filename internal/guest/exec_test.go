package guest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func TestExecSpecValidate(t *testing.T) {
	good := []ExecSpec{
		{Argv: []string{"true"}},
		{Argv: []string{"sh", "-c", ""}, Env: map[string]string{"A": "x=y"}, Cwd: "/tmp", Timeout: MaxExecTimeout},
	}
	bad := []ExecSpec{
		{},
		{Argv: []string{""}},
		{Argv: []string{"true"}, Env: map[string]string{"": "x"}},
		{Argv: []string{"true"}, Env: map[string]string{"A=B": "x"}},
		{Argv: []string{"true"}, Env: map[string]string{"A": "x\x00"}},
		{Argv: []string{"true"}, Cwd: "tmp"},
		{Argv: []string{"true"}, Cwd: "/tmp/../etc"},
		{Argv: []string{"true"}, Timeout: -time.Second},
		{Argv: []string{"true"}, Timeout: MaxExecTimeout + time.Second},
	}
	for _, s := range good {
		if err := s.Validate(); err != nil {
			t.Errorf("%+v: %v", s, err)
		}
	}
	for _, s := range bad {
		if err := s.Validate(); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", s, err)
		}
	}
	if got := (ExecSpec{Env: map[string]string{"B": "2", "A": "1"}}).EnvList(); !slices.Equal(got, []string{"A=1", "B=2"}) {
		t.Errorf("EnvList %q", got)
	}
}

func TestValidExecID(t *testing.T) {
	if !ValidExecID("abcdefghijklmnop") || ValidExecID("abcdefghijklmno1") || ValidExecID("ABCDEFGHIJKLMNOP") || ValidExecID("") {
		t.Fatal("exec id check")
	}
	if !errors.Is(ErrNoExec, errdefs.ErrNotFound) || !IsNoExec(ErrNoExec) {
		t.Fatal("ErrNoExec is not a not-found")
	}
}
