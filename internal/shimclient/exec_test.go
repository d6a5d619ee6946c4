package shimclient

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
)

func TestExecIDsAreCheckedBeforeDialing(t *testing.T) {
	c := New(filepath.Join(t.TempDir(), "shim.sock"))
	defer c.Close()
	for _, id := range []string{"", "short", "AAAAAAAAAAAAAAAA", "aaaaaaaaaaaaaaa1", "../../../etc/pas"} {
		if _, err := c.GetExec(t.Context(), id); !errors.Is(err, errdefs.ErrNotFound) || !guest.IsNoExec(err) {
			t.Errorf("get %q: %v", id, err)
		}
		if _, err := c.Attach(t.Context(), id, AttachOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("attach %q: %v", id, err)
		}
	}
	if n := c.Dials(); n != 0 {
		t.Fatalf("%d dials for malformed exec ids", n)
	}
}
