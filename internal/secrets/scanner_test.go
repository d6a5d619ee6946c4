package secrets

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"
)

const (
	ph1 = "airlock-secret-0123456789abcdef0123456789abcdef"
	ph2 = "airlock-secret-fedcba9876543210fedcba9876543210"
)

func TestScannerFind(t *testing.T) {
	t.Parallel()
	s := NewScanner([]string{ph1, ph2})
	b64 := func(enc *base64.Encoding, prefix string) string {
		return enc.EncodeToString([]byte(prefix + ph2 + "tail"))
	}
	tests := []struct {
		name, in string
		want     string // "" for no match
	}{
		{"plain", "x=" + ph1 + "&y", ph1},
		{"upper", strings.ToUpper(ph2), ph2},
		{"mixed case", "AirLock-Secret-FEDCBA9876543210fedcba9876543210", ph2},
		{"earliest wins", ph2 + " " + ph1, ph2},
		{"hex", hex.EncodeToString([]byte(ph1)), ph1},
		{"upper hex", strings.ToUpper(hex.EncodeToString([]byte(ph1))), ph1},
		{"base64 align 0", b64(base64.StdEncoding, ""), ph2},
		{"base64 align 1", b64(base64.StdEncoding, "a"), ph2},
		{"base64 align 2", b64(base64.StdEncoding, "ab"), ph2},
		{"basic auth", "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+ph1)), ph1},
		{"basic auth password first", base64.StdEncoding.EncodeToString([]byte(ph1 + ":x")), ph1},
		{"url-safe base64 align 1", b64(base64.RawURLEncoding, "?"), ph2},
		{"url-safe base64 align 2", b64(base64.URLEncoding, "??"), ph2},
		{"no match", "airlock-secret-0123 hello", ""},
		{"other placeholder", "airlock-secret-00000000000000000000000000000000", ""},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		got, ok := s.Find([]byte(tt.in))
		if got != tt.want || ok != (tt.want != "") {
			t.Errorf("%s: Find = %q, %v; want %q", tt.name, got, ok, tt.want)
		}
	}
	if _, ok := NewScanner(nil).Find([]byte(ph1)); ok {
		t.Error("an empty scanner matched")
	}
}

// guardRun writes each chunk through a fresh Guard and returns what was
// forwarded and the first error.
func guardRun(s *Scanner, chunks []string) (string, error) {
	var out bytes.Buffer
	g := s.Guard(&out)
	for _, c := range chunks {
		if _, err := g.Write([]byte(c)); err != nil {
			return out.String(), err
		}
	}
	return out.String(), g.Flush()
}

func TestGuard(t *testing.T) {
	t.Parallel()
	s := NewScanner([]string{ph1, ph2})

	// Split into 1-byte writes, with unrelated data first.
	msg := "GET /?k=" + strings.ToUpper(ph1) + " HTTP/1.1\r\n"
	var chunks []string
	for i := range len(msg) {
		chunks = append(chunks, msg[i:i+1])
	}
	out, err := guardRun(s, chunks)
	var pe *PlaceholderError
	if !errors.As(err, &pe) || pe.Placeholder != ph1 || !errors.Is(err, ErrPlaceholder) {
		t.Fatalf("split placeholder: err = %v", err)
	}
	if out != "GET /?k=" {
		t.Errorf("split placeholder: forwarded %q", out)
	}
	if !strings.Contains(err.Error(), ph1) {
		t.Errorf("error %q does not name the placeholder", err)
	}

	// Basic auth split across writes at every position.
	basic := "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+ph2)) + "\r\n"
	for i := 1; i < len(basic); i++ {
		if _, err := guardRun(s, []string{basic[:i], basic[i:]}); !errors.Is(err, ErrPlaceholder) {
			t.Fatalf("basic auth split at %d: err = %v", i, err)
		}
	}

	// Unrelated data is never held back.
	var buf bytes.Buffer
	g := s.Guard(&buf)
	if _, err := g.Write([]byte("hello\n")); err != nil || buf.String() != "hello\n" {
		t.Fatalf("hello: forwarded %q, err %v", buf.String(), err)
	}
	// A possible start is held back until it is resolved.
	if _, err := g.Write([]byte("x airlock-sec")); err != nil || buf.String() != "hello\nx " {
		t.Fatalf("partial: forwarded %q, err %v", buf.String(), err)
	}
	if _, err := g.Write([]byte("ond")); err != nil || buf.String() != "hello\nx airlock-second" {
		t.Fatalf("resolved: forwarded %q, err %v", buf.String(), err)
	}
	if _, err := g.Write([]byte(" AIRLOCK-")); err != nil || buf.String() != "hello\nx airlock-second " {
		t.Fatalf("partial 2: forwarded %q, err %v", buf.String(), err)
	}
	if err := g.Flush(); err != nil || buf.String() != "hello\nx airlock-second AIRLOCK-" {
		t.Fatalf("flush: forwarded %q, err %v", buf.String(), err)
	}

	// After a match, every write fails and nothing more is forwarded.
	buf.Reset()
	g = s.Guard(&buf)
	if _, err := g.Write([]byte("ok " + ph2)); !errors.Is(err, ErrPlaceholder) {
		t.Fatalf("err = %v", err)
	}
	if _, err := g.Write([]byte("more")); !errors.Is(err, ErrPlaceholder) {
		t.Fatalf("later write: err = %v", err)
	}
	if err := g.Flush(); !errors.Is(err, ErrPlaceholder) || buf.Len() != 0 {
		t.Fatalf("flush after match: err = %v, forwarded %q", err, buf.String())
	}
}

func FuzzGuard(f *testing.F) {
	f.Add([]byte("hello world"), []byte{3, 1, 4})
	f.Add([]byte("x"+ph1+"y"), []byte{1, 1, 1, 1, 7})
	f.Add([]byte(strings.ToUpper(ph2)), []byte{20})
	f.Add([]byte(base64.StdEncoding.EncodeToString([]byte("user:"+ph1))), []byte{5, 9})
	f.Add([]byte("airlock-secret-0123airlock-secret-"), []byte{2})
	s := NewScanner([]string{ph1, ph2})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		var out bytes.Buffer
		g := s.Guard(&out)
		rest := data
		var err error
		for i := 0; len(rest) > 0 && err == nil; i++ {
			n := len(rest)
			if i < len(cuts) {
				n = min(n, int(cuts[i])%16+1)
			}
			_, err = g.Write(rest[:n])
			rest = rest[n:]
		}
		if err == nil {
			err = g.Flush()
		}
		if ph, ok := s.Find(out.Bytes()); ok {
			t.Fatalf("forwarded bytes contain %s: %q", ph, out.Bytes())
		}
		if !bytes.HasPrefix(data, out.Bytes()) {
			t.Fatalf("forwarded %q is not a prefix of the input %q", out.Bytes(), data)
		}
		if _, present := s.Find(data); !present && (err != nil || !bytes.Equal(out.Bytes(), data)) {
			t.Fatalf("no placeholder in %q but forwarded %q, err %v", data, out.Bytes(), err)
		} else if present && !errors.Is(err, ErrPlaceholder) {
			t.Fatalf("placeholder in %q not reported (err %v)", data, err)
		}
	})
}

func TestReplacer(t *testing.T) {
	t.Parallel()
	r := newReplacer("secret", "PH1", "sec", "PH2", "xx", "Y")
	if got := r.String("a secret sec secsecret xxx"); got != "a PH1 PH2 PH2PH1 Yx" {
		t.Errorf("String = %q", got)
	}
	// Streamed one byte at a time through replaceReader.
	in := strings.Repeat("..secret.sec.s", 50)
	rr := replaceReader(nopCloser{&oneByteReader{s: in}}, r)
	var out bytes.Buffer
	if _, err := out.ReadFrom(rr); err != nil {
		t.Fatal(err)
	}
	if want := r.String(in); out.String() != want {
		t.Errorf("streamed = %q, want %q", out.String(), want)
	}
}

type oneByteReader struct{ s string }

func (r *oneByteReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	p[0] = r.s[0]
	r.s = r.s[1:]
	return 1, nil
}

type nopCloser struct{ *oneByteReader }

func (nopCloser) Close() error { return nil }
