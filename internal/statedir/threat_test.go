package statedir

import (
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/guest"
)

// TestThreat105IdentifierHygiene: sandbox and exec ids carry at least 96
// random bits (20 base32 characters, 100 bits), never repeat in a large
// sample, and nothing but an id passes validation (no path, no case, no
// other length), so ids can neither be guessed nor smuggle a path.
func TestThreat105IdentifierHygiene(t *testing.T) {
	const n = 20000
	for name, gen := range map[string]func() string{"sandbox": NewID, "exec": guest.NewExecID} {
		seen := make(map[string]bool, n)
		var used [32]bool
		for range n {
			id := gen()
			if len(id)*5 < 96 {
				t.Fatalf("%s id %q: %d bits, want at least 96", name, id, len(id)*5)
			}
			if seen[id] {
				t.Fatalf("%s id %q repeated within %d", name, id, n)
			}
			seen[id] = true
			for _, c := range id {
				i := strings.IndexRune("abcdefghijklmnopqrstuvwxyz234567", c)
				if i < 0 {
					t.Fatalf("%s id %q: character %q outside [a-z2-7]", name, id, c)
				}
				used[i] = true
			}
		}
		for i, u := range used {
			if !u {
				t.Errorf("%s ids never use %q in %d ids: not uniform", name, "abcdefghijklmnopqrstuvwxyz234567"[i], n)
			}
		}
	}
	if err := ValidateID(NewID()); err != nil {
		t.Fatal(err)
	}
	if !guest.ValidExecID(guest.NewExecID()) {
		t.Fatal("a new exec id is refused")
	}
	for _, bad := range []string{"", "../../etc/pa", "aaaaaaaaaaa/", "AAAAAAAAAAAA", "aaaaaaaaaaaa\x00", "aaaaaaaaaaaaa",
		strings.Repeat("a", 19), strings.Repeat("a", 21), "aaaaaaaaaaaaaaaaaa01", " aaaaaaaaaaaaaaaaaaa"} {
		if ValidateID(bad) == nil {
			t.Errorf("sandbox id %q accepted", bad)
		}
		if guest.ValidExecID(bad) {
			t.Errorf("exec id %q accepted", bad)
		}
	}
}
