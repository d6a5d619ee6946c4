package store

import (
	"slices"
	"testing"
)

func TestListEventsType(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := Open(ctx, catalogAt(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, a := range []string{"net.allow", "network.x", "net", "exec.start", "net.secret.inject", "netx.deny", "net_allow"} {
		if _, err := s.AppendEvent(ctx, Event{SandboxID: "s1", Action: a}); err != nil {
			t.Fatal(err)
		}
	}
	for typ, want := range map[string][]string{
		"net":        {"net.allow", "net", "net.secret.inject"},
		"net.secret": {"net.secret.inject"},
		"exec.start": {"exec.start"},
		"ne":         nil,
		"%":          nil,
	} {
		evs, err := s.ListEvents(ctx, EventFilter{Type: typ})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range evs {
			got = append(got, e.Action)
		}
		if !slices.Equal(got, want) {
			t.Errorf("type %q: %v, want %v", typ, got, want)
		}
	}
}
