package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// The config file of `airlock serve` (--config FILE, env AIRLOCK_CONFIG;
// packaging/airlock.yaml is the commented default). Each key stands for
// one flag; a setting comes from, first to last:
//
//  1. the command line (a flag given there);
//  2. the environment variable of the flag, where it has one
//     (AIRLOCK_LISTEN, AIRLOCK_STATE_DIR, ...), when set and not empty;
//  3. the config file;
//  4. the built-in default.
//
// The file is hostile until checked: at most maxConfigBytes, a regular file
// that not every user may write, one YAML document whose top level is a
// mapping, `version: 1`, known keys only (an unknown key is an error naming
// it and its line), each at most once, one plain value each (no anchors,
// aliases or tags). Values are parsed by the flag they set, so a file and
// a command line are held to the same rules. Relative paths are relative
// to the file's directory.

// maxConfigBytes caps a config file.
const maxConfigBytes = 64 << 10

// configVersion is the format this airlock reads.
const configVersion = "1"

// configKey is one key of the file: the flag it sets, the environment
// variable that overrides it ("" for none), whether it is a path, and a
// check of its value (run whether or not a flag or the environment
// overrides the key: a bad file fails now, not when the override goes).
type configKey struct {
	key, flag, env string
	path           bool
	// list: the value may be a YAML list, each item given to the flag in
	// turn (a repeatable flag); a command line that gives the flag
	// replaces the whole list.
	list  bool
	check func(string) error
}

func oneOf(vals ...string) func(string) error {
	return func(v string) error {
		if !slices.Contains(vals, v) {
			return fmt.Errorf("%q is not one of %s", v, strings.Join(vals, ", "))
		}
		return nil
	}
}

func checkLevel(v string) error {
	var l slog.Level
	return l.UnmarshalText([]byte(v))
}

func checkReserve(v string) error {
	_, err := parseReserve(v)
	return err
}

// configKeys are the keys a config file may have ("a.b" is b in section
// a), in the order of packaging/airlock.yaml.
var configKeys = []configKey{
	{key: "listen", flag: "listen", env: "AIRLOCK_LISTEN"},
	{key: "tls.cert", flag: "tls-cert", path: true},
	{key: "tls.key", flag: "tls-key", path: true},
	{key: "preview_domain", flag: "preview-domain", env: "AIRLOCK_PREVIEW_DOMAIN"},
	{key: "drain", flag: "drain", check: func(v string) error { _, err := time.ParseDuration(v); return err }},
	{key: "log.level", flag: "log-level", check: checkLevel},
	{key: "log.access", flag: "access-log", check: func(v string) error { _, err := strconv.ParseBool(v); return err }},
	{key: "state_dir", flag: "state-dir", env: "AIRLOCK_STATE_DIR", path: true},
	{key: "runtime", flag: "runtime", env: "AIRLOCK_RUNTIME", check: oneOf("qemu", "gvisor", "auto")},
	{key: "accel", flag: "accel", env: "AIRLOCK_ACCEL", check: oneOf("auto", "kvm", "tcg")},
	{key: "host_cgroups", flag: "host-cgroups", env: "AIRLOCK_HOST_CGROUPS", check: oneOf("auto", "on", "off")},
	{key: "disk_reserve", flag: "disk-reserve", env: "AIRLOCK_DISK_RESERVE", check: checkReserve},
	{key: "allow_host_mount", flag: "allow-host-mount", path: true, list: true},
	{key: "template_registry", flag: "template-registry", list: true},
}

// configSections are the keys that hold other keys.
var configSections = []string{"tls", "log"}

// configValue is one setting a file makes.
type configValue struct {
	key   configKey
	value string
	line  int
}

// readServeConfig reads and checks the config file at path.
func readServeConfig(path string) ([]configValue, error) {
	check := func(fi os.FileInfo) error {
		switch {
		case !fi.Mode().IsRegular():
			return fmt.Errorf("%w: config %s is not a regular file", errdefs.ErrInvalid, path)
		case fi.Mode().Perm()&0o002 != 0:
			return fmt.Errorf("%w: config %s may be written by every user: chmod o-w it", errdefs.ErrInvalid, path)
		}
		return nil
	}
	// Checked before the open too: opening a FIFO would block.
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if err := check(fi); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if err := check(fi); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(b) > maxConfigBytes {
		return nil, fmt.Errorf("%w: config %s is larger than %d KiB", errdefs.ErrInvalid, path, maxConfigBytes>>10)
	}
	return parseServeConfig(path, b)
}

// parseServeConfig checks the text of a config file named name.
func parseServeConfig(name string, b []byte) ([]configValue, error) {
	fail := func(line int, format string, args ...any) error {
		return fmt.Errorf("%w: %s:%d: %s", errdefs.ErrInvalid, name, line, fmt.Sprintf(format, args...))
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: %s is empty: it needs at least \"version: %s\"", errdefs.ErrInvalid, name, configVersion)
		}
		return nil, fmt.Errorf("%w: %s: %v", errdefs.ErrInvalid, name, err)
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, fail(more.Line, "a second YAML document (a config file holds one)")
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return nil, fail(root.Line, "the file must be a mapping of settings (key: value)")
	}
	var out []configValue
	version, seen := 0, map[string]int{}
	var walk func(n *yaml.Node, prefix string) error
	walk = func(n *yaml.Node, prefix string) error {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
				return fail(k.Line, "a key must be a plain name")
			}
			name := prefix + k.Value
			if first, dup := seen[name]; dup {
				return fail(k.Line, "%s is set twice (first on line %d)", name, first)
			}
			seen[name] = k.Line
			if v.Kind == yaml.AliasNode || v.Anchor != "" || k.Anchor != "" {
				return fail(v.Line, "%s: anchors and aliases are not allowed", name)
			}
			if v.Style&yaml.TaggedStyle != 0 {
				return fail(v.Line, "%s: tags (%s) are not allowed", name, v.Tag)
			}
			if slices.Contains(configSections, name) {
				switch {
				case v.Kind == yaml.MappingNode:
					if err := walk(v, name+"."); err != nil {
						return err
					}
				case v.Kind == yaml.ScalarNode && v.Tag == "!!null":
					// An empty section: its keys are commented out.
				default:
					return fail(v.Line, "%s must be a section of keys (%s)", name, sectionKeys(name))
				}
				continue
			}
			if name == "version" {
				if v.Kind != yaml.ScalarNode || v.Value != configVersion {
					return fail(v.Line, "version %q: this airlock reads version %s", v.Value, configVersion)
				}
				version = v.Line
				continue
			}
			i := slices.IndexFunc(configKeys, func(c configKey) bool { return c.key == name })
			if i < 0 {
				return fail(k.Line, "unknown key %q (known: version, %s)", name, knownKeys())
			}
			if configKeys[i].list && v.Kind == yaml.SequenceNode {
				for _, item := range v.Content {
					switch {
					case item.Kind != yaml.ScalarNode || item.Anchor != "" || item.Style&yaml.TaggedStyle != 0:
						return fail(item.Line, "%s: each item must be one plain value", name)
					case item.Tag == "!!null" || item.Value == "":
						return fail(item.Line, "%s: an item has no value", name)
					case strings.ContainsRune(item.Value, 0):
						return fail(item.Line, "%s holds a NUL byte", name)
					}
					out = append(out, configValue{configKeys[i], item.Value, item.Line})
				}
				continue
			}
			switch {
			case v.Kind != yaml.ScalarNode && configKeys[i].list:
				return fail(v.Line, "%s must be one value or a list of values, not a section", name)
			case v.Kind != yaml.ScalarNode:
				return fail(v.Line, "%s must be one value, not a list or a section", name)
			case v.Tag == "!!null":
				return fail(v.Line, "%s has no value (comment the line out for the default)", name)
			case strings.ContainsRune(v.Value, 0):
				return fail(v.Line, "%s holds a NUL byte", name)
			}
			out = append(out, configValue{configKeys[i], v.Value, v.Line})
		}
		return nil
	}
	if err := walk(root, ""); err != nil {
		return nil, err
	}
	if version == 0 {
		return nil, fail(root.Line, "no \"version: %s\" (the format of the file)", configVersion)
	}
	return out, nil
}

func knownKeys() string {
	var ks []string
	for _, k := range configKeys {
		ks = append(ks, k.key)
	}
	return strings.Join(ks, ", ")
}

func sectionKeys(section string) string {
	var ks []string
	for _, k := range configKeys {
		if rest, ok := strings.CutPrefix(k.key, section+"."); ok {
			ks = append(ks, rest)
		}
	}
	return strings.Join(ks, ", ")
}

// applyServeConfig sets the flags of fs that the file at name sets, but
// for those the command line or their environment variable set already
// (getenv reads the environment). A value the flag refuses is an error
// naming the key and its line.
func applyServeConfig(fs *pflag.FlagSet, name string, vals []configValue, getenv func(string) string) error {
	dir := filepath.Dir(name)
	for _, v := range vals {
		f := fs.Lookup(v.key.flag)
		if f == nil {
			return fmt.Errorf("config key %s: no flag --%s", v.key.key, v.key.flag) // a bug of configKeys
		}
		val := v.value
		if v.key.check != nil {
			if err := v.key.check(val); err != nil {
				return fmt.Errorf("%w: %s:%d: %s: %v", errdefs.ErrInvalid, name, v.line, v.key.key, err)
			}
		}
		if f.Changed || v.key.env != "" && getenv(v.key.env) != "" {
			continue
		}
		if v.key.path && val != "" && !filepath.IsAbs(val) {
			val = filepath.Join(dir, val)
		}
		// The flag's own parser, not fs.Set, whose error names a flag the
		// user did not give.
		if err := f.Value.Set(val); err != nil {
			return fmt.Errorf("%w: %s:%d: %s: %v", errdefs.ErrInvalid, name, v.line, v.key.key, err)
		}
	}
	return nil
}
