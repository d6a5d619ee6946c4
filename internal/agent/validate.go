package agent

import (
	"path"
	"strings"
)

// Limits on what the host may ask for.
const (
	// maxPath caps a path (PATH_MAX).
	maxPath = 4096
	// maxArg caps one argv or env string (the kernel's MAX_ARG_STRLEN,
	// less the NUL).
	maxArg = 128<<10 - 1
	// maxArgTotal caps argv, and separately env, in total.
	maxArgTotal = 1 << 20
)

// checkPath validates a path from the host: absolute, at most maxPath bytes,
// no NUL, and already clean (no "." or ".." elements, no double or trailing
// slash).
func checkPath(p string) error {
	if why := pathProblem(p); why != "" {
		return invalidf("path %s", why)
	}
	return nil
}

// pathProblem says what is wrong with p, or "".
func pathProblem(p string) string {
	switch {
	case p == "":
		return "is empty"
	case len(p) > maxPath:
		return "is too long"
	case strings.IndexByte(p, 0) >= 0:
		return "contains NUL"
	case p[0] != '/':
		return "is not absolute"
	case path.Clean(p) != p:
		return "is not clean"
	}
	return ""
}

// checkArgv validates an exec's argv.
func checkArgv(argv []string) error {
	if len(argv) == 0 || argv[0] == "" {
		return invalidf("argv is empty")
	}
	total := 0
	for i, a := range argv {
		if len(a) > maxArg {
			return invalidf("argv[%d] is longer than %d bytes", i, maxArg)
		}
		if strings.IndexByte(a, 0) >= 0 {
			return invalidf("argv[%d] contains NUL", i)
		}
		total += len(a) + 1
	}
	if total > maxArgTotal {
		return invalidf("argv is longer than %d bytes in total", maxArgTotal)
	}
	return nil
}

// checkEnv validates "KEY=VALUE" entries.
func checkEnv(env []string) error {
	total := 0
	for i, e := range env {
		k, _, ok := strings.Cut(e, "=")
		if !ok {
			return invalidf("env[%d] is not KEY=VALUE", i)
		}
		if !validEnvKey(k) {
			return invalidf("env[%d] has an invalid key", i)
		}
		if len(e) > maxArg {
			return invalidf("env[%d] is longer than %d bytes", i, maxArg)
		}
		if strings.IndexByte(e, 0) >= 0 {
			return invalidf("env[%d] contains NUL", i)
		}
		total += len(e) + 1
	}
	if total > maxArgTotal {
		return invalidf("env is longer than %d bytes in total", maxArgTotal)
	}
	return nil
}

// validEnvKey accepts portable names ([A-Za-z_][A-Za-z0-9_]*) plus '.' and
// '-' after the first character, which some tools use.
func validEnvKey(k string) bool {
	if k == "" || len(k) > 256 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '.' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// defaultPath is PATH when the host does not set one.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// buildEnv returns the default environment for id with the host's entries
// applied over it (a later entry for the same key wins).
func buildEnv(id identity, extra []string) []string {
	env := []string{
		"PATH=" + defaultPath,
		"HOME=" + id.home,
		"USER=" + id.name,
		"LOGNAME=" + id.name,
		"LANG=C.UTF-8",
	}
	index := make(map[string]int, len(env)+len(extra))
	for i, e := range env {
		k, _, _ := strings.Cut(e, "=")
		index[k] = i
	}
	for _, e := range extra {
		k, _, _ := strings.Cut(e, "=")
		if i, ok := index[k]; ok {
			env[i] = e
			continue
		}
		index[k] = len(env)
		env = append(env, e)
	}
	return env
}

// envValue returns the value of key in env.
func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}
