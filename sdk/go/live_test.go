package airlock_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// liveClient gates the live tier: tests against a real `airlock serve`.
// It skips under -short or unless AIRLOCK_TEST_API and AIRLOCK_TEST_API_KEY are set, and
// fails when AIRLOCK_TEST_VM=1 asked for real guests but the API is not
// configured, so that the tier cannot vanish silently from `make test`.
func liveClient(t *testing.T) *airlock.Client {
	t.Helper()
	if testing.Short() {
		t.Skip("live SDK tier: not under -short")
	}
	host, key := os.Getenv("AIRLOCK_TEST_API"), os.Getenv("AIRLOCK_TEST_API_KEY")
	if host == "" || key == "" {
		if os.Getenv("AIRLOCK_TEST_VM") == "1" {
			t.Fatal("AIRLOCK_TEST_VM=1 but AIRLOCK_TEST_API and AIRLOCK_TEST_API_KEY are not both set: start `airlock serve` and export its URL and an API key")
		}
		t.Skip("live SDK tier: set AIRLOCK_TEST_API=http://HOST:PORT and AIRLOCK_TEST_API_KEY to test against `airlock serve`")
	}
	return airlock.New(host, key)
}

func TestLiveSandbox(t *testing.T) { liveSandbox(t, liveClient(t)) }

// liveSandbox is TestLiveSandbox's body, against c (a live server, or the
// fake in the unit tier: TestLiveAgainstFake).
func liveSandbox(t *testing.T, c *airlock.Client) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute) // TCG, and maybe a template build
	defer cancel()

	sb, err := c.Create(ctx, airlock.CreateOptions{Timeout: 5 * time.Minute, Metadata: map[string]string{"test": "sdk-go"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Kill(context.WithoutCancel(ctx), sb.ID); err != nil && !errors.Is(err, airlock.ErrNotFound) {
			t.Errorf("cleanup kill: %v", err)
		}
	})
	if sb.State != airlock.StateRunning {
		t.Fatalf("created sandbox in state %q (%s)", sb.State, sb.Reason)
	}

	res, err := c.Run(ctx, sb.ID, airlock.ExecRequest{Cmd: []string{"python3", "-c", "print(6*7)"}})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "42\n" || res.Exit.Code != 0 {
		t.Fatalf("python3: stdout %q stderr %q exit %+v", res.Stdout, res.Stderr, res.Exit)
	}

	// 5 MB of random bytes in and out, compared by sha256.
	const size = 5 << 20
	src := make([]byte, size)
	_, _ = rand.Read(src)
	want := sha256.Sum256(src)
	up := sha256.New()
	n, err := c.WriteFile(ctx, sb.ID, "/tmp/blob", io.TeeReader(bytes.NewReader(src), up))
	if err != nil {
		t.Fatal(err)
	}
	if n != size || !bytes.Equal(up.Sum(nil), want[:]) {
		t.Fatalf("uploaded %d bytes", n)
	}
	rc, err := c.ReadFile(ctx, sb.ID, "/tmp/blob")
	if err != nil {
		t.Fatal(err)
	}
	down := sha256.New()
	got, err := io.Copy(down, rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got != size || !bytes.Equal(down.Sum(nil), want[:]) {
		t.Fatalf("downloaded %d bytes, sha256 %x, want %x", got, down.Sum(nil), want)
	}
	// The guest agrees.
	res, err = c.Run(ctx, sb.ID, airlock.ExecRequest{Cmd: []string{"sha256sum", "/tmp/blob"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Stdout) < 64 || string(res.Stdout[:64]) != hex.EncodeToString(want[:]) {
		t.Fatalf("guest sha256sum: %q", res.Stdout)
	}

	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// Gone, or at most still "stopping".
	if got, err := c.Get(ctx, sb.ID); err == nil && got.State != airlock.StateStopping {
		t.Fatalf("after Kill: state %q", got.State)
	} else if err != nil && !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("Get after Kill: %v", err)
	}
}
