package store

import (
	"bytes"
	"testing"
)

func TestSecretIsMadeOnceAndKept(t *testing.T) {
	st := openTest(t)
	a, err := st.Secret(t.Context(), "secret.e2b")
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 32 || bytes.Equal(a, make([]byte, 32)) {
		t.Fatalf("secret %x", a)
	}
	b, err := st.Secret(t.Context(), "secret.e2b")
	if err != nil || !bytes.Equal(a, b) {
		t.Fatalf("second read %x, %v; want %x", b, err, a)
	}
	c, err := st.Secret(t.Context(), "secret.other")
	if err != nil || bytes.Equal(a, c) {
		t.Fatalf("another name gave %x, %v", c, err)
	}
	for _, bad := range []string{"", "e2b", "secret.", "secret.E2B", "secret.a b", "audit.max_age"} {
		if _, err := st.Secret(t.Context(), bad); err == nil {
			t.Errorf("Secret(%q) was accepted", bad)
		}
	}
}
