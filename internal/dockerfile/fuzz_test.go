package dockerfile

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// FuzzParse checks that any input either parses into a plan whose steps
// have lines and kinds, or is refused with a categorised *LineError.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"FROM base\nRUN echo hi\n",
		"ARG V=1\nFROM img:$V\nENV A=${V:-x} B $A\nCOPY --chmod=0755 a* /x/\nEXPOSE 80/udp 1-3\n",
		"FROM base\nRUN <<EOF\nx\nEOF\n",
		"# escape=`\nFROM base\nRUN a `\n b\n",
		"FROM base\nCMD [\"a\", \"b\"]\nENTRYPOINT x\nUSER ${U:?missing}\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		p, err := Parse(strings.NewReader(src), map[string]string{"V": "2"})
		if err != nil {
			if _, ok := errors.AsType[*LineError](err); !ok || !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("error %v (%T) is not an ErrInvalid *LineError", err, err)
			}
			return
		}
		if p.From == "" || p.FromLine < 1 {
			t.Fatalf("plan without FROM: %+v", p)
		}
		for _, s := range p.Steps {
			if s.Line < p.FromLine || s.Kind == "" || len(s.Text) > maxTextBytes {
				t.Fatalf("bad step %+v", s)
			}
			if s.Kind == "COPY" || s.Kind == "ADD" {
				if !strings.HasPrefix(s.Dest, "/") || len(s.Sources) == 0 {
					t.Fatalf("bad copy step %+v", s)
				}
			}
		}
		if err := p.Keys(nil, "base"); err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("Keys: %v", err)
		}
	})
}
