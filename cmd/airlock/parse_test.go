package main

import (
	"errors"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

func TestParseMiB(t *testing.T) {
	for in, want := range map[string]int{"512M": 512, "2G": 2048, "2GiB": 2048, "1024": 1024, "256mb": 256, "1T": 1 << 20} {
		got, err := parseMiB(in)
		if err != nil || got != want {
			t.Errorf("parseMiB(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "lots", "-1G", "0", "1.5G", "99999999999G"} {
		if _, err := parseMiB(in); err == nil {
			t.Errorf("parseMiB(%q) accepted", in)
		}
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"5s": 5 * time.Second, "15m": 15 * time.Minute, "30": 30 * time.Second} {
		got, err := parseDuration(in)
		if err != nil || got != want {
			t.Errorf("parseDuration(%q) = %s, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "-3s", "0", "soon"} {
		if _, err := parseDuration(in); err == nil {
			t.Errorf("parseDuration(%q) accepted", in)
		}
	}
}

func TestSplitRemote(t *testing.T) {
	if id, p, ok := splitRemote("abcdefghijkl:/srv/x"); !ok || id != "abcdefghijkl" || p != "/srv/x" {
		t.Fatalf("got %q %q %v", id, p, ok)
	}
	for _, s := range []string{"./local.txt", "C:/x", "/abs/path", "../x:/y"} {
		if _, _, ok := splitRemote(s); ok {
			t.Errorf("%q parsed as remote", s)
		}
	}
}

func TestParseWarmPool(t *testing.T) {
	p, err := parseWarmPool("image=python, size=4,cpus=2,memory=1024")
	if err != nil || p != (sandbox.WarmPool{Image: "python", Size: 4, CPUs: 2, MemoryMiB: 1024}) {
		t.Fatalf("full spec: %+v %v", p, err)
	}
	if p, err := parseWarmPool("size=1"); err != nil || p != (sandbox.WarmPool{Size: 1}) {
		t.Fatalf("size only: %+v %v", p, err)
	}
	for _, bad := range []string{"", "image=base", "size=0", "size=-1", "size=x", "size=1,size=2", "size=1,colour=red", "size=1,image", "size=1,image="} {
		if _, err := parseWarmPool(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%q: %v, want invalid", bad, err)
		}
	}
}
