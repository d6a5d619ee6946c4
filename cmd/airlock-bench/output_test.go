package main

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestParseRow(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		value string
		num   *float64
		unit  string
		ratio *float64
	}{
		{"211 ms", f(211), "ms", nil},
		{"0.15% of a core", f(0.15), "%", nil},
		{"1.84x", f(1.84), "x", f(1.84)},
		{"4.2 s (8.6x)", f(4.2), "s", f(8.6)},
		{"92 MB/s", f(92), "MB/s", nil},
		{"200", f(200), "", nil},
		{"RSS 80 MiB, PSS 40 MiB", nil, "", nil},
		{"skipped: no node", nil, "", nil},
	} {
		j := parseRow(row{what: "w", value: c.value, note: "n"})
		if (j.Value == nil) != (c.num == nil) || (j.Value != nil && *j.Value != *c.num) || j.Unit != c.unit ||
			(j.Ratio == nil) != (c.ratio == nil) || (j.Ratio != nil && *j.Ratio != *c.ratio) || j.Text != c.value {
			t.Errorf("%q: %+v", c.value, j)
		}
	}
}

func TestPrintJSON(t *testing.T) {
	var b bytes.Buffer
	if err := printJSON(&b, header{Accel: "tcg", CPUs: 2}, []row{{"create, qemu", "211 ms", "median of 5"}}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Accel string `json:"accel"`
		CPUs  int    `json:"host_cpus"`
		Rows  []struct {
			Name  string  `json:"name"`
			Value float64 `json:"value"`
			Unit  string  `json:"unit"`
			Note  string  `json:"note"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if doc.Accel != "tcg" || doc.CPUs != 2 || len(doc.Rows) != 1 || doc.Rows[0].Name != "create, qemu" || doc.Rows[0].Value != 211 || doc.Rows[0].Unit != "ms" || doc.Rows[0].Note != "median of 5" {
		t.Fatalf("%+v", doc)
	}
}
