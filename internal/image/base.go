package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// The base image: Debian bookworm with what code-running agents expect.
const (
	baseSuite   = "bookworm"
	baseVariant = "apt"
	// BaseSource is recorded as the base image's source; its revision
	// changes with the recipe (BasePackages, finishBaseTree), and `airlock
	// setup` rebuilds a base image recorded with another. r2: pip and venv.
	BaseSource = "mmdebstrap:" + baseSuite + "+r2"
	// defaultMirror is used when the host's apt sources cannot be read.
	defaultMirror = "http://deb.debian.org/debian"
)

// BasePackages are installed into the base image on top of mmdebstrap's
// apt variant (Essential: yes packages plus apt).
var BasePackages = []string{
	"bash", "coreutils", "procps", "ca-certificates", "curl", "git",
	"python3", "python3-numpy", "python3-pandas", "python3-matplotlib", "python3-ipykernel",
	"python3-pip", "python3-venv",
	"nodejs",
	// python3-fonttools (a matplotlib dependency) needs python3-scipy or
	// python3-munkres. apt would pick SciPy, which drags in pythran, GCC
	// and the Boost headers (about 500 MB); naming munkres avoids that.
	"python3-munkres",
}

// baseDpkgOpts keep documentation, man pages and translations out of the
// image (copyright files stay).
var baseDpkgOpts = []string{
	"path-exclude=/usr/share/doc/*",
	"path-include=/usr/share/doc/*/copyright",
	"path-exclude=/usr/share/man/*",
	"path-exclude=/usr/share/info/*",
	"path-exclude=/usr/share/locale/*",
	"path-include=/usr/share/locale/locale.alias",
}

// BuildBase builds the default image, Debian bookworm with BasePackages,
// with mmdebstrap from the mirrors the host's apt uses, and records it as
// name. The tree gets /etc/hostname ("airlock"), an empty regular
// /etc/resolv.conf (the agent writes it) and a minimal /etc/hosts, and is
// smoke-tested (python3 imports numpy, pandas and matplotlib) before it
// becomes an ext4 blob. Takes a minute or two; needs root. The staging
// directory is always removed.
func (s *Store) BuildBase(ctx context.Context, name string, progress io.Writer) (Image, error) {
	return s.Build(ctx, name, BaseRecipe, progress)
}

// Recipe is an image airlock builds from Debian packages with mmdebstrap.
type Recipe struct {
	// Name is what `airlock image build --recipe` calls it.
	Name string
	// Source is recorded as the image's source; its revision changes with
	// the recipe, so a caller can tell an image built by an older one.
	Source string
	// Packages are installed on top of mmdebstrap's apt variant.
	Packages []string
	// Finish, if set, runs after the shared configuration (finishBaseTree).
	Finish func(rootfs string) error
	// Smoke runs in the finished tree (chrooted) and fails the build if
	// the tree does not work.
	Smoke func(ctx context.Context, rootfs string) error
}

// BaseRecipe is the default image: Debian bookworm with what code-running
// agents expect.
var BaseRecipe = Recipe{Name: "base", Source: BaseSource, Packages: BasePackages, Smoke: smokeTest}

// Recipes are the images `airlock image build` knows, by name.
func Recipes() []Recipe { return []Recipe{BaseRecipe, BrowserRecipe} }

// RecipeNamed returns the recipe called name.
func RecipeNamed(name string) (Recipe, bool) {
	for _, r := range Recipes() {
		if r.Name == name {
			return r, true
		}
	}
	return Recipe{}, false
}

// Build builds an image from r, records it as name and returns it (see
// BuildBase). Progress lines go to progress.
func (s *Store) Build(ctx context.Context, name string, r Recipe, progress io.Writer) (Image, error) {
	start := time.Now()
	img, err := s.buildRecipe(ctx, name, r, progress, start)
	if err != nil {
		return Image{}, fmt.Errorf("build %s image %q: %w", r.Name, name, err)
	}
	return img, nil
}

func (s *Store) buildRecipe(ctx context.Context, name string, r Recipe, progress io.Writer, start time.Time) (Image, error) {
	if err := ValidName(name); err != nil {
		return Image{}, err
	}
	if os.Geteuid() != 0 {
		return Image{}, errors.New("mmdebstrap needs root")
	}
	stage, err := s.stagingDir(r.Name + "-")
	if err != nil {
		return Image{}, err
	}
	defer s.removeStaging(stage)
	rootfs := filepath.Join(stage, "rootfs")

	mirrors := hostMirrors(s.log)
	progressf(progress, start, "mmdebstrap: %s (%s) from %s", baseSuite, baseVariant, strings.Join(mirrors, "; "))
	if err := s.mmdebstrap(ctx, rootfs, r.Packages, mirrors, progress, start); err != nil {
		return Image{}, err
	}
	if err := finishBaseTree(rootfs); err != nil {
		return Image{}, fmt.Errorf("configure tree: %w", err)
	}
	if r.Finish != nil {
		if err := r.Finish(rootfs); err != nil {
			return Image{}, fmt.Errorf("configure tree: %w", err)
		}
	}
	if err := r.Smoke(ctx, rootfs); err != nil {
		return Image{}, err
	}
	u, err := measureTree(rootfs)
	if err != nil {
		return Image{}, err
	}
	progressf(progress, start, "smoke test passed; tree is %s in %d inodes", humanBytes(u.bytes), u.inodes)

	ext4 := filepath.Join(stage, "image.ext4")
	size, err := mkfsExt4(ctx, rootfs, ext4)
	if err != nil {
		return Image{}, err
	}
	progressf(progress, start, "mkfs: %s ext4", humanBytes(size))
	img, err := s.commit(ctx, name, r.Source, ext4)
	if err != nil {
		return Image{}, err
	}
	progressf(progress, start, "image %s: %s", name, img.Digest)
	s.log.Info("image created", "image", name, "digest", img.Digest, "size", img.Size, "source", r.Source,
		"duration", time.Since(start).Round(time.Millisecond))
	return img, nil
}

// mmdebstrap runs mmdebstrap into rootfs, forwarding its "I:" lines to
// progress and keeping the tail of its output for errors.
func (s *Store) mmdebstrap(ctx context.Context, rootfs string, packages, mirrors []string, progress io.Writer, start time.Time) error {
	args := []string{
		"--mode=root",
		"--variant=" + baseVariant,
		"--include=" + strings.Join(packages, ","),
		// Recommends would add compilers, Boost headers and SciPy (about
		// 800 MB). The setting also stays in the image for later installs.
		`--aptopt=APT::Install-Recommends "false"`,
	}
	for _, o := range baseDpkgOpts {
		args = append(args, "--dpkgopt="+o)
	}
	args = append(args, baseSuite, rootfs)
	args = append(args, mirrors...)

	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "DEBIAN_FRONTEND=noninteractive")
	cmd.WaitDelay = 10 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	cmd.Stderr = pw
	var (
		wg   sync.WaitGroup
		last lastLines
	)
	wg.Go(func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			last.add(line)
			s.log.Debug("mmdebstrap", "line", line)
			if msg, ok := strings.CutPrefix(line, "I: "); ok {
				progressf(progress, start, "mmdebstrap: %s", msg)
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	})
	err := cmd.Run()
	pw.Close()
	wg.Wait()
	if err != nil {
		return fmt.Errorf("mmdebstrap: %w: %s", err, last.String())
	}
	return nil
}

// lastLines keeps the last few lines of a command's output.
type lastLines struct{ lines []string }

func (l *lastLines) add(s string) {
	if len(l.lines) == 15 {
		l.lines = l.lines[1:]
	}
	l.lines = append(l.lines, s)
}

func (l *lastLines) String() string { return strings.Join(l.lines, "\n") }

// finishBaseTree writes the files the guest expects. It never follows a
// symlink at these paths: an existing file or link is removed first.
func finishBaseTree(rootfs string) error {
	files := []struct {
		path, content string
	}{
		{"etc/hostname", "airlock\n"},
		{"etc/resolv.conf", ""},
		{"etc/hosts", "127.0.0.1\tlocalhost\n127.0.1.1\tairlock\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
	}
	// PEP 668's marker makes pip refuse to install into the system
	// Python, which protects a long-lived host's packages from pip; a
	// sandbox is disposable, and agents run `pip install x` there.
	markers, err := filepath.Glob(filepath.Join(rootfs, "usr", "lib", "python3*", "EXTERNALLY-MANAGED"))
	if err != nil {
		return err
	}
	for _, m := range markers {
		if err := os.Remove(m); err != nil {
			return err
		}
	}
	for _, f := range files {
		p := filepath.Join(rootfs, filepath.FromSlash(f.path))
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		_, err = io.WriteString(out, f.content)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// smokeTestScript must print "ok" in the new tree.
const smokeTestScript = "import numpy, pandas, matplotlib, pip, venv; print('ok')"

// smokeTest runs python3 in the tree to check that the scientific stack
// imports. Matplotlib's cache goes to a directory removed afterwards.
func smokeTest(ctx context.Context, rootfs string) error {
	return chrootSmoke(ctx, rootfs, "ok", "/usr/bin/python3", "-c", smokeTestScript)
}

// chrootSmoke runs argv chrooted in rootfs, with HOME (and matplotlib's
// cache) in a directory removed afterwards, and wants want as the first
// line of its output.
func chrootSmoke(ctx context.Context, rootfs, want string, argv ...string) error {
	tmp := filepath.Join(rootfs, "tmp", "airlock-smoke")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("smoke test: %w", err)
	}
	defer os.RemoveAll(tmp)
	cmd := exec.CommandContext(ctx, "chroot", append([]string{rootfs}, argv...)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/tmp/airlock-smoke", "MPLCONFIGDIR=/tmp/airlock-smoke", "PYTHONDONTWRITEBYTECODE=1", "LC_ALL=C.UTF-8"}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if err != nil || !strings.HasPrefix(first, want) {
		return fmt.Errorf("smoke test: %s: %v: %s", strings.Join(argv, " "), err, tail(string(out), 1024))
	}
	return nil
}

// hostMirrors returns mmdebstrap mirror arguments ("deb URI suite
// components") for the bookworm suites in the host's apt sources, or
// defaultMirror if none are found.
func hostMirrors(log *slog.Logger) []string {
	var lines []string
	if b, err := os.ReadFile("/etc/apt/sources.list.d/debian.sources"); err == nil {
		lines = append(lines, parseDeb822Sources(b)...)
	}
	if b, err := os.ReadFile("/etc/apt/sources.list"); err == nil {
		lines = append(lines, parseSourcesList(b)...)
	}
	var out []string
	seen := map[string]bool{}
	for _, l := range lines {
		if !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		log.Debug("no bookworm apt sources on the host; using the default mirror", "mirror", defaultMirror)
		return []string{defaultMirror}
	}
	return out
}

// parseDeb822Sources reads deb822 .sources stanzas and returns one-line
// "deb URI suite components" entries for bookworm suites.
func parseDeb822Sources(b []byte) []string {
	var out []string
	for stanza := range strings.SplitSeq(strings.ReplaceAll(string(b), "\r", ""), "\n\n") {
		fields := map[string]string{}
		for line := range strings.SplitSeq(stanza, "\n") {
			if strings.HasPrefix(line, "#") {
				continue
			}
			if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, " ") {
				fields[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			}
		}
		if !slices.Contains(strings.Fields(fields["types"]), "deb") || strings.EqualFold(fields["enabled"], "no") {
			continue
		}
		comps := fields["components"]
		if comps == "" {
			comps = "main"
		}
		for _, uri := range strings.Fields(fields["uris"]) {
			for _, suite := range strings.Fields(fields["suites"]) {
				if validMirrorLine(uri, suite) {
					out = append(out, "deb "+uri+" "+suite+" "+comps)
				}
			}
		}
	}
	return out
}

// parseSourcesList reads one-line sources.list entries for bookworm suites.
func parseSourcesList(b []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, "#"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") { // options: [arch=amd64 signed-by=...]
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) < 2 || !validMirrorLine(f[0], f[1]) {
			continue
		}
		comps := "main"
		if len(f) > 2 {
			comps = strings.Join(f[2:], " ")
		}
		out = append(out, "deb "+f[0]+" "+f[1]+" "+comps)
	}
	return out
}

func validMirrorLine(uri, suite string) bool {
	return (strings.HasPrefix(uri, "http://") || strings.HasPrefix(uri, "https://") || strings.HasPrefix(uri, "file:/")) &&
		(suite == baseSuite || strings.HasPrefix(suite, baseSuite+"-") || strings.HasPrefix(suite, baseSuite+"/"))
}
