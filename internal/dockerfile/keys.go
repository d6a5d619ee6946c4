package dockerfile

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"strconv"
)

// keyVersion changes whenever what a key covers changes, so that old
// cache entries stop matching.
const keyVersion = 1

// keyInput is what a step's key hashes, as JSON (map keys sorted).
type keyInput struct {
	Version int      `json:"v"`
	Prev    string   `json:"prev"`
	Kind    string   `json:"kind"`
	Argv    []string `json:"argv,omitempty"`
	Env     []string `json:"env,omitempty"`
	Sources []string `json:"sources,omitempty"`
	Dest    string   `json:"dest,omitempty"`
	Chown   string   `json:"chown,omitempty"`
	Chmod   string   `json:"chmod,omitempty"`
	Config  Config   `json:"config"`
	Args    []string `json:"args,omitempty"`
	Content string   `json:"content,omitempty"`
}

// Keys fills in every step's Key, starting from base (the resolved FROM
// image's digest or the template's id: any string that identifies the base
// exactly). COPY/ADD keys read the context c (nil is refused when the plan
// has such a step). On an error no Key is changed.
func (p *Plan) Keys(c *Context, base string) error {
	keys := make([]string, len(p.Steps))
	prev := base
	for i, s := range p.Steps {
		in := keyInput{
			Version: keyVersion, Prev: prev, Kind: s.Kind,
			Argv: s.Argv, Env: s.Env, Sources: s.Sources, Dest: s.Dest, Chown: s.Chown, Chmod: s.Chmod,
			Config: s.Config, Args: s.args,
		}
		if s.Kind == "COPY" || s.Kind == "ADD" {
			if c == nil {
				return invalid(s.Line, "%s needs a build context", s.Kind)
			}
			d, err := c.digest(s)
			if err != nil {
				return err
			}
			in.Content = d
		}
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("step key: %w", err)
		}
		sum := sha256.Sum256(b)
		keys[i] = "sha256:" + hex.EncodeToString(sum[:])
		prev = keys[i]
	}
	for i := range p.Steps {
		p.Steps[i].Key = keys[i]
	}
	return nil
}

// digest hashes what CopyTar would send for s: the directory, and each
// entry's name, type, mode, size, link target and data; not mtimes.
func (c *Context) digest(s Step) (string, error) {
	cp, err := c.plan(s)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	field(h, cp.dir)
	err = c.emit(cp, func(hd *tar.Header, data io.Reader) error {
		field(h, hd.Name)
		field(h, string(hd.Typeflag))
		field(h, strconv.FormatInt(hd.Mode, 8))
		field(h, strconv.FormatInt(hd.Size, 10))
		field(h, hd.Linkname)
		if data != nil {
			if _, err := io.Copy(h, data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// field writes s to h, length first, so that fields cannot run together.
func field(h hash.Hash, s string) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(s)))
	h.Write(n[:])
	h.Write([]byte(s))
}
