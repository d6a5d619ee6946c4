package netconf

import (
	"errors"
	"slices"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func TestNormalizeAbuseLimits(t *testing.T) {
	t.Parallel()
	s, err := Spec{}.Normalize(nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.ConnRate != DefaultConnRate || s.DestsPerMin != DefaultDestsPerMin || s.UDPRate != DefaultUDPRate {
		t.Fatalf("defaults: %+v", s)
	}
	s, err = Spec{ConnRate: -5, DestsPerMin: 7, UDPRate: -1}.Normalize(nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.ConnRate != -1 || s.DestsPerMin != 7 || s.UDPRate != -1 {
		t.Fatalf("negative means no limit, a value stays: %+v", s)
	}
	// Normalize is idempotent.
	if s2, err := s.Normalize(nil); err != nil || s2.ConnRate != -1 || s2.DestsPerMin != 7 {
		t.Fatalf("again: %+v %v", s2, err)
	}
	for _, bad := range []Spec{{ConnRate: MaxAbuseLimit + 1}, {DestsPerMin: MaxAbuseLimit + 1}, {UDPRate: MaxAbuseLimit + 1}} {
		if _, err := bad.Normalize(nil); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%+v: %v, want invalid", bad, err)
		}
	}
}

func TestWithEgress(t *testing.T) {
	base, err := Spec{Mode: "public", Secrets: []Secret{{Name: "TOKEN", Hosts: []string{"api.example.com"}}}, RateBytes: 1 << 20}.
		Normalize(Values{"TOKEN": "v"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := base.WithEgress("", []string{"example.com", "10.0.0.1:443"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Mode != "deny" || !slices.Equal(got.Allow, []string{"example.com", "10.0.0.1:443"}) {
		t.Fatalf("mode %q allow %v", got.Mode, got.Allow)
	}
	if got.RateBytes != base.RateBytes || len(got.Secrets) != 1 || got.Secrets[0].Placeholder != base.Secrets[0].Placeholder {
		t.Fatalf("the rest of the spec changed: %+v", got)
	}
	for _, tc := range []struct {
		mode  string
		allow []string
		want  error
	}{
		{"deny", []string{"*.com"}, errdefs.ErrInvalid},
		{"sideways", nil, errdefs.ErrInvalid},
		{"none", nil, errdefs.ErrInvalid},
		{"deny", make([]string, MaxAllowRules+1), errdefs.ErrInvalid},
	} {
		if _, err := base.WithEgress(tc.mode, tc.allow); !errors.Is(err, tc.want) {
			t.Errorf("WithEgress(%q, %d rules): %v, want %v", tc.mode, len(tc.allow), err, tc.want)
		}
	}
	none := Spec{Mode: "none"}
	if _, err := none.WithEgress("public", nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("none -> public: %v", err)
	}
	if s, err := none.WithEgress("none", nil); err != nil || s.Mode != "none" {
		t.Errorf("none -> none: %+v %v", s, err)
	}
}

func TestSecretHeaderScope(t *testing.T) {
	t.Parallel()
	sec, err := ParseSecretFlag("TOKEN@api.example.com,*.example.org:x-api-key")
	if err != nil || sec.Name != "TOKEN" || !slices.Equal(sec.Hosts, []string{"api.example.com", "*.example.org"}) || sec.Header != "x-api-key" {
		t.Fatalf("ParseSecretFlag: %+v %v", sec, err)
	}
	if sec, err := ParseSecretFlag("TOKEN@api.example.com"); err != nil || sec.Header != "" {
		t.Fatalf("unscoped: %+v %v", sec, err)
	}
	// A vault secret takes a header scope too, with or without hosts.
	for flag, want := range map[string]Secret{
		"vault:GH:Authorization":           {Name: "GH", Vault: "GH", Header: "Authorization"},
		"vault:GH@api.github.com:X-Token":  {Name: "GH", Vault: "GH", Hosts: []string{"api.github.com"}, Header: "X-Token"},
		"vault:GH@a.example.com,b.example": {Name: "GH", Vault: "GH", Hosts: []string{"a.example.com", "b.example"}},
	} {
		got, err := ParseSecretFlag(flag)
		if err != nil || got.Name != want.Name || got.Vault != want.Vault || got.Header != want.Header || !slices.Equal(got.Hosts, want.Hosts) {
			t.Errorf("ParseSecretFlag(%q) = %+v, %v; want %+v", flag, got, err, want)
		}
	}
	for _, bad := range []string{"TOKEN@api.example.com:", "TOKEN@:X-Key", "TOKEN:X-Key", "vault:GH:", "vault:GH@:X-Key", "vault::X-Key"} {
		if _, err := ParseSecretFlag(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParseSecretFlag(%q): %v, want invalid", bad, err)
		}
	}
	s, err := Spec{Secrets: []Secret{sec}}.Normalize(Values{"TOKEN": "v"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Secrets[0].Header != "X-Api-Key" {
		t.Errorf("header %q, want the canonical X-Api-Key", s.Secrets[0].Header)
	}
	for _, h := range []string{"443", "Host", "content-length", "Transfer-Encoding", "Connection", "Upgrade", "TE", "X Key", "X-Key:"} {
		sec := Secret{Name: "TOKEN", Hosts: []string{"api.example.com"}, Header: h}
		if _, err := (Spec{Secrets: []Secret{sec}}).Normalize(Values{"TOKEN": "v"}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("header %q: %v, want invalid", h, err)
		}
	}
}
