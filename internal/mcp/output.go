package mcp

import (
	"fmt"
	"strings"
)

// output collects the text of one tool result under one byte budget
// shared by its streams; what does not fit is counted for a note.
type output struct {
	budget         *int
	stdout, stderr *stream
}

type stream struct {
	name    string
	budget  *int
	buf     strings.Builder
	dropped int64
}

func newOutput(limit int) *output {
	b := new(int)
	*b = limit
	return &output{budget: b, stdout: &stream{name: "stdout", budget: b}, stderr: &stream{name: "stderr", budget: b}}
}

// Write keeps what fits the budget and counts the rest as dropped; it
// never fails.
func (s *stream) Write(p []byte) (int, error) {
	n := min(len(p), max(*s.budget, 0))
	s.buf.Write(p[:n])
	*s.budget -= n
	s.dropped += int64(len(p) - n)
	return len(p), nil
}

// take spends up to len(p) bytes of the budget on extra text and returns
// what fits.
func (o *output) take(p string) (string, bool) {
	n := min(len(p), max(*o.budget, 0))
	*o.budget -= n
	return p[:n], n < len(p)
}

// text renders the streams, then status.
func (o *output) text(status string) string {
	var b strings.Builder
	for _, s := range []*stream{o.stdout, o.stderr} {
		if s.buf.Len() == 0 && s.dropped == 0 {
			continue
		}
		fmt.Fprintf(&b, "--- %s ---\n%s", s.name, strings.ToValidUTF8(s.buf.String(), "\uFFFD"))
		if !strings.HasSuffix(s.buf.String(), "\n") {
			b.WriteByte('\n')
		}
		if s.dropped > 0 {
			fmt.Fprintf(&b, "[%s truncated: %d more bytes dropped (the tool result is capped); write large output to a file and use file_read]\n", s.name, s.dropped)
		}
	}
	b.WriteString(status)
	return b.String()
}
