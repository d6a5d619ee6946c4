package main

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"text/tabwriter"
)

// row is one line of the table: what was measured, the result as the
// table shows it, and how it was measured.
type row struct{ what, value, note string }

// header is what the table's first line says of the machine.
type header struct {
	Accel       string `json:"accel"`
	AccelReason string `json:"accel_reason"`
	VMM         string `json:"vmm"`
	Kernel      string `json:"guest_kernel"`
	CPUs        int    `json:"host_cpus"`
}

// jsonRow is a row as --json prints it. Value and unit are the result's
// leading number and unit ("211 ms", "0.15% of a core", "1.84x"); Ratio
// is a ratio the result states against a baseline of the same run (a
// result that is one, or "4.2 s (8.6x)"), whose name the note gives. A
// result with no leading number (for example "RSS 80 MiB, PSS 40 MiB")
// has only its text.
type jsonRow struct {
	Name  string   `json:"name"`
	Value *float64 `json:"value"`
	Unit  string   `json:"unit,omitempty"`
	Ratio *float64 `json:"ratio,omitempty"`
	Text  string   `json:"text"`
	Note  string   `json:"note,omitempty"`
}

var (
	leadingNumber = regexp.MustCompile(`^(-?[0-9]+(?:\.[0-9]+)?)\s*(%|x\b|[A-Za-z/]+(?:/s)?)?`)
	statedRatio   = regexp.MustCompile(`\((-?[0-9]+(?:\.[0-9]+)?)x\)`)
)

func parseRow(r row) jsonRow {
	j := jsonRow{Name: r.what, Text: r.value, Note: r.note}
	if m := leadingNumber.FindStringSubmatch(r.value); m != nil {
		v, _ := strconv.ParseFloat(m[1], 64)
		j.Value, j.Unit = &v, m[2]
		if j.Unit == "x" {
			j.Ratio = &v
		}
	}
	if m := statedRatio.FindStringSubmatch(r.value); m != nil && j.Ratio == nil {
		v, _ := strconv.ParseFloat(m[1], 64)
		j.Ratio = &v
	}
	return j
}

// printJSON writes the header and the rows as one JSON document.
func printJSON(w io.Writer, h header, rows []row) error {
	doc := struct {
		header
		Rows []jsonRow `json:"rows"`
	}{header: h, Rows: make([]jsonRow, 0, len(rows))}
	for _, r := range rows {
		doc.Rows = append(doc.Rows, parseRow(r))
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}

// printTable writes the header line and the Markdown table of the README.
func printTable(w io.Writer, h header, rows []row) error {
	fmt.Fprintf(w, "airlock bench: accel=%s (%s), %s, guest kernel %s, %d host CPUs\n\n", h.Accel, h.AccelReason, h.VMM, h.Kernel, h.CPUs)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "| measurement\t| result\t| notes\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|")
	for _, r := range rows {
		fmt.Fprintf(tw, "| %s\t| %s\t| %s\t|\n", r.what, r.value, r.note)
	}
	return tw.Flush()
}
