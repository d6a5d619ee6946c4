package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"
)

// The platform airlock guests run.
var guestPlatform = v1.Platform{OS: "linux", Architecture: "amd64"}

// Archive kinds Import accepts.
const (
	archiveDocker = "docker-save"
	archiveOCI    = "oci-layout"
)

// Import builds image name from a `docker save` tarball or a tarball of
// an OCI image layout (detected from its contents). The archive must hold
// one linux/amd64 image (an OCI index may hold several platforms; the
// linux/amd64 one is used). Blobs are verified against their digests,
// layers are flattened with whiteouts applied and unpacked safely (see the
// package doc), and the result becomes an ext4 blob. An existing image of
// that name is replaced; its blob stays until Prune.
//
// An empty name is derived from the archive: its image's tag (docker
// save's RepoTags, or an OCI layout's io.containerd.image.name or
// org.opencontainers.image.ref.name annotation) as in DefaultName, or
// else the file name without its extension.
func (s *Store) Import(ctx context.Context, name, tarPath string, progress io.Writer) (Image, error) {
	start := time.Now()
	if name != "" {
		if err := ValidName(name); err != nil {
			return Image{}, fmt.Errorf("import %s: %w", filepath.Base(tarPath), err)
		}
	}
	img, err := s.importImage(ctx, name, tarPath, progress, start)
	if err != nil {
		return Image{}, fmt.Errorf("import %s: %w", filepath.Base(tarPath), err)
	}
	return img, nil
}

func (s *Store) importImage(ctx context.Context, name, tarPath string, progress io.Writer, start time.Time) (Image, error) {
	if err := s.requirePrivilege("import"); err != nil {
		return Image{}, err
	}
	kind, err := detectArchive(tarPath)
	if err != nil {
		return Image{}, err
	}
	stage, err := s.stagingDir("import-")
	if err != nil {
		return Image{}, err
	}
	defer s.removeStaging(stage)

	var (
		img        v1.Image
		refName    string // the image's reference as the archive records it, if any
		checkBlobs bool
	)
	switch kind {
	case archiveDocker:
		img, err = tarball.ImageFromPath(tarPath, nil)
		if err != nil {
			return Image{}, fmt.Errorf("%w: read docker-save archive: %v", ErrInvalid, err)
		}
		if m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(tarPath) }); err == nil && len(m) == 1 && len(m[0].RepoTags) > 0 {
			refName = m[0].RepoTags[0]
		}
	case archiveOCI:
		dir := filepath.Join(stage, "layout")
		if err := extractLayoutTar(ctx, tarPath, dir, s.limits()); err != nil {
			return Image{}, err
		}
		var ann map[string]string
		img, ann, err = imageFromLayout(dir)
		if err != nil {
			return Image{}, err
		}
		refName = cmp.Or(ann["io.containerd.image.name"], ann["org.opencontainers.image.ref.name"])
		checkBlobs = true
	}
	if name == "" {
		if name, err = importName(refName, tarPath); err != nil {
			return Image{}, err
		}
	}
	progressf(progress, start, "import: %s archive %s as %q", kind, filepath.Base(tarPath), name)
	return s.build(ctx, name, "import:"+filepath.Base(tarPath), img, stage, checkBlobs, true, progress, start)
}

// Pull builds image name from ref in a registry. An empty name means
// DefaultName(ref). opts go to go-containerregistry's remote package after
// airlock's own (context, linux/amd64 platform), so they can add
// authentication or a transport. Layers are downloaded (at most three at a
// time), verified against their digests, then handled as in Import.
func (s *Store) Pull(ctx context.Context, ref, name string, progress io.Writer, opts ...remote.Option) (Image, error) {
	start := time.Now()
	img, err := s.pull(ctx, ref, name, progress, start, opts)
	if err != nil {
		return Image{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	return img, nil
}

// PullBlob pulls ref like Pull but names no image: it returns the blob
// (Image.Name empty) and the digest of the manifest it was made from. The
// caller keeps the blob's digest (a template build's base) and keeps it
// from Prune.
func (s *Store) PullBlob(ctx context.Context, ref string, progress io.Writer, opts ...remote.Option) (Image, string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return Image{}, "", fmt.Errorf("%w: bad reference: %v", ErrInvalid, err)
	}
	if err := s.requirePrivilege("pull"); err != nil {
		return Image{}, "", err
	}
	start := time.Now()
	ropts := append([]remote.Option{remote.WithContext(ctx), remote.WithPlatform(guestPlatform)}, opts...)
	rimg, err := remote.Image(r, ropts...)
	if err != nil {
		return Image{}, "", fmt.Errorf("pull %s: fetch manifest: %w", ref, err)
	}
	digest, err := rimg.Digest()
	if err != nil {
		return Image{}, "", fmt.Errorf("pull %s: fetch manifest: %w", ref, err)
	}
	stage, err := s.stagingDir("pull-")
	if err != nil {
		return Image{}, "", err
	}
	defer s.removeStaging(stage)
	limg, err := s.download(ctx, rimg, filepath.Join(stage, "layout"), progress, start)
	if err != nil {
		return Image{}, "", fmt.Errorf("pull %s: %w", ref, err)
	}
	img, err := s.build(ctx, "", "pull:"+r.String()+"@"+digest.String(), limg, stage, true, false, progress, start)
	if err != nil {
		return Image{}, "", fmt.Errorf("pull %s: %w", ref, err)
	}
	return img, digest.String(), nil
}

// RemoteDigest returns the digest of the manifest (or index) ref names now
// in its registry, without pulling it.
func RemoteDigest(ctx context.Context, ref string, opts ...remote.Option) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("%w: bad reference: %v", ErrInvalid, err)
	}
	desc, err := remote.Head(r, append([]remote.Option{remote.WithContext(ctx)}, opts...)...)
	if err != nil {
		return "", err
	}
	return desc.Digest.String(), nil
}

func (s *Store) pull(ctx context.Context, ref, imgName string, progress io.Writer, start time.Time, opts []remote.Option) (Image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return Image{}, fmt.Errorf("%w: bad reference: %v", ErrInvalid, err)
	}
	if imgName == "" {
		if imgName, err = defaultName(r); err != nil {
			return Image{}, err
		}
	}
	if err := ValidName(imgName); err != nil {
		return Image{}, err
	}
	if err := s.requirePrivilege("pull"); err != nil {
		return Image{}, err
	}
	ropts := append([]remote.Option{remote.WithContext(ctx), remote.WithPlatform(guestPlatform)}, opts...)
	rimg, err := remote.Image(r, ropts...)
	if err != nil {
		return Image{}, fmt.Errorf("fetch manifest: %w", err)
	}
	digest, err := rimg.Digest()
	if err != nil {
		return Image{}, fmt.Errorf("fetch manifest: %w", err)
	}
	stage, err := s.stagingDir("pull-")
	if err != nil {
		return Image{}, err
	}
	defer s.removeStaging(stage)

	dir := filepath.Join(stage, "layout")
	limg, err := s.download(ctx, rimg, dir, progress, start)
	if err != nil {
		return Image{}, err
	}
	return s.build(ctx, imgName, "pull:"+r.String()+"@"+digest.String(), limg, stage, true, true, progress, start)
}

// download copies img's blobs into a new OCI layout at dir and returns the
// image read back from it. Remote blobs are verified as they are read.
func (s *Store) download(ctx context.Context, img v1.Image, dir string, progress io.Writer, start time.Time) (v1.Image, error) {
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return nil, err
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	var declared int64
	for _, l := range m.Layers {
		declared += l.Size
	}
	limit := s.limits().MaxBytes
	if declared > limit {
		return nil, fmt.Errorf("%w: layers are %d bytes compressed, more than %d", ErrLimit, declared, limit)
	}
	progressf(progress, start, "pull: %d layers, %s compressed", len(layers), humanBytes(declared))

	var total atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(3)
	for i, l := range layers {
		g.Go(func() error {
			d, err := l.Digest()
			if err != nil {
				return err
			}
			rc, err := l.Compressed()
			if err != nil {
				return fmt.Errorf("layer %s: %w", d, err)
			}
			cr := &capReader{r: rc, ctx: gctx, total: &total, limit: limit}
			if err := p.WriteBlob(d, struct {
				io.Reader
				io.Closer
			}{cr, rc}); err != nil {
				return fmt.Errorf("layer %s: %w", d, err)
			}
			progressf(progress, start, "pull: layer %d/%d %s %s", i+1, len(layers), shortDigest(d.String()), humanBytes(cr.n))
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("download: %w", err)
	}

	cfgName, err := img.ConfigName()
	if err != nil {
		return nil, err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	if err := p.WriteBlob(cfgName, io.NopCloser(bytes.NewReader(cfg))); err != nil {
		return nil, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return nil, err
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	if err := p.WriteBlob(digest, io.NopCloser(bytes.NewReader(raw))); err != nil {
		return nil, err
	}
	mt, err := img.MediaType()
	if err != nil {
		return nil, err
	}
	if err := p.AppendDescriptor(v1.Descriptor{MediaType: mt, Size: int64(len(raw)), Digest: digest}); err != nil {
		return nil, err
	}
	limg, _, err := imageFromLayout(dir)
	return limg, err
}

// importName derives an image name for Import: from ref (a tag recorded in
// the archive) if it parses as a reference with a repository, else from
// the archive's file name.
func importName(ref, tarPath string) (string, error) {
	// A bare OCI ref.name ("3.12") is only a tag; it takes a repository
	// to make a name.
	if strings.ContainsAny(ref, ":/") {
		if r, err := name.ParseReference(ref); err == nil {
			if n, err := defaultName(r); err == nil {
				return n, nil
			}
		}
	}
	base := filepath.Base(tarPath)
	for _, ext := range []string{".tar", ".oci", ".docker"} {
		base = strings.TrimSuffix(base, ext)
	}
	n := sanitizeName(base)
	if err := ValidName(n); err != nil {
		return "", fmt.Errorf("no image name given and none derivable from %q: %w", filepath.Base(tarPath), err)
	}
	return n, nil
}

// build verifies img, unpacks its flattened filesystem under stage, makes
// the ext4 file and commits it as name (record), or as a blob only.
func (s *Store) build(ctx context.Context, name, source string, img v1.Image, stage string, checkBlobs, record bool, progress io.Writer, start time.Time) (Image, error) {
	rootfs := filepath.Join(stage, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return Image{}, err
	}
	st, err := s.unpackImage(ctx, img, checkBlobs, rootfs, progress, start)
	if err != nil {
		return Image{}, err
	}
	ext4 := filepath.Join(stage, "image.ext4")
	size, err := mkfsExt4(ctx, rootfs, ext4)
	if err != nil {
		return Image{}, err
	}
	progressf(progress, start, "mkfs: %s ext4", humanBytes(size))
	out, err := s.storeBlob(ctx, name, source, ext4, record)
	if err != nil {
		return Image{}, err
	}
	progressf(progress, start, "image %s: %s", cmp.Or(name, "(unnamed)"), out.Digest)
	s.log.Info("image created", "image", name, "digest", out.Digest, "size", out.Size, "source", source,
		"entries", st.entries, "duration", time.Since(start).Round(time.Millisecond))
	return out, nil
}

// unpackImage verifies img and unpacks its flattened filesystem into
// rootfs, an empty directory. checkBlobs also hashes the compressed layers
// (for layouts and pulls, whose blobs carry digests).
func (s *Store) unpackImage(ctx context.Context, img v1.Image, checkBlobs bool, rootfs string, progress io.Writer, start time.Time) (unpackStats, error) {
	layers, err := verifyImage(img, checkBlobs, s.limits())
	if err != nil {
		return unpackStats{}, err
	}
	var sizes int64
	for _, l := range layers {
		if n, err := l.Size(); err == nil {
			sizes += n
		}
	}
	progressf(progress, start, "verify: %d layers, %s", len(layers), humanBytes(sizes))

	vimg := &verifiedImage{Image: img}
	for i, l := range layers {
		vimg.layers = append(vimg.layers, &verifiedLayer{
			Layer: l,
			done: func(n int64) {
				d, _ := l.Digest()
				progressf(progress, start, "unpack: layer %d/%d %s %s", i+1, len(layers), shortDigest(d.String()), humanBytes(n))
			},
		})
	}
	rc := mutate.Extract(vimg)
	st, err := unpack(ctx, rc, rootfs, unpackOptions{limits: s.limits(), chown: os.Geteuid() == 0, log: s.log})
	rc.Close()
	if err != nil {
		return st, err
	}
	// mutate.Extract ends its tar stream cleanly even when a layer fails
	// between entries, so a complete-looking stream proves nothing: every
	// layer must have been read to EOF and matched its diff id.
	for _, l := range vimg.layers {
		if err := l.result(); err != nil {
			return st, err
		}
	}
	progressf(progress, start, "unpack: %d entries, %s in files, %d skipped", st.entries, humanBytes(st.bytes), st.skipped)
	return st, nil
}

func (s *Store) removeStaging(dir string) {
	if err := removeAll(dir); err != nil {
		s.log.Warn("remove staging dir", "path", dir, "err", err)
	}
}

// verifyImage checks what can be checked before unpacking: the config
// digest against the manifest, the platform, the layer count against the
// config's diff_ids, and (checkBlobs) every compressed layer against its
// digest and size. The uncompressed content is checked against the diff
// ids while unpacking (verifiedLayer).
func verifyImage(img v1.Image, checkBlobs bool, lim Limits) ([]v1.Layer, error) {
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("%w: read manifest: %v", ErrInvalid, err)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%w: read config: %v", ErrInvalid, err)
	}
	if got := sha256Hex(raw); m.Config.Digest.Algorithm != "sha256" || m.Config.Digest.Hex != got {
		return nil, fmt.Errorf("%w: config digest is sha256:%s, manifest says %s", ErrInvalid, got, m.Config.Digest)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%w: parse config: %v", ErrInvalid, err)
	}
	if (cfg.OS != "" && cfg.OS != guestPlatform.OS) || (cfg.Architecture != "" && cfg.Architecture != guestPlatform.Architecture) {
		return nil, fmt.Errorf("%w: image is for %s/%s; airlock guests are %s/%s", ErrInvalid,
			cfg.OS, cfg.Architecture, guestPlatform.OS, guestPlatform.Architecture)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("%w: read layers: %v", ErrInvalid, err)
	}
	if len(layers) != len(cfg.RootFS.DiffIDs) {
		return nil, fmt.Errorf("%w: %d layers but %d diff ids in config", ErrInvalid, len(layers), len(cfg.RootFS.DiffIDs))
	}
	if !checkBlobs {
		return layers, nil
	}
	var total int64
	for _, l := range layers {
		want, err := l.Digest()
		if err != nil {
			return nil, fmt.Errorf("%w: layer digest: %v", ErrInvalid, err)
		}
		if mt, err := l.MediaType(); err == nil && !mt.IsLayer() {
			return nil, fmt.Errorf("%w: layer %s has media type %s", ErrInvalid, want, mt)
		}
		rc, err := l.Compressed()
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", want, err)
		}
		h := sha256.New()
		n, err := io.Copy(h, io.LimitReader(rc, lim.MaxBytes-total+1))
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", want, err)
		}
		if total += n; total > lim.MaxBytes {
			return nil, fmt.Errorf("%w: layers are more than %d bytes compressed", ErrLimit, lim.MaxBytes)
		}
		if got := hex.EncodeToString(h.Sum(nil)); want.Algorithm != "sha256" || got != want.Hex {
			return nil, fmt.Errorf("%w: layer %s has digest sha256:%s", ErrInvalid, want, got)
		}
		if size, err := l.Size(); err == nil && size != n {
			return nil, fmt.Errorf("%w: layer %s is %d bytes, manifest says %d", ErrInvalid, want, n, size)
		}
	}
	return layers, nil
}

// verifiedImage is img with layers that check their uncompressed content
// against the config's diff ids as mutate.Extract reads them.
type verifiedImage struct {
	v1.Image
	layers []*verifiedLayer
}

func (v *verifiedImage) Layers() ([]v1.Layer, error) {
	out := make([]v1.Layer, len(v.layers))
	for i, l := range v.layers {
		out[i] = l
	}
	return out, nil
}

type verifiedLayer struct {
	v1.Layer
	done func(n int64)

	mu       sync.Mutex
	verified bool
	err      error // diff id mismatch
}

// finish records the outcome of reading the layer to EOF.
func (l *verifiedLayer) finish(n int64, err error) {
	l.mu.Lock()
	first := !l.verified && l.err == nil
	if err != nil {
		l.err = err
	} else {
		l.verified = true
	}
	l.mu.Unlock()
	if first && err == nil && l.done != nil {
		l.done(n)
	}
}

// result says whether the layer was read to the end and matched.
func (l *verifiedLayer) result() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if !l.verified {
		d, _ := l.Digest()
		return fmt.Errorf("%w: layer %s was not read to the end", ErrInvalid, d)
	}
	return nil
}

func (l *verifiedLayer) Uncompressed() (io.ReadCloser, error) {
	want, err := l.DiffID()
	if err != nil {
		return nil, fmt.Errorf("%w: layer diff id: %v", ErrInvalid, err)
	}
	if want.Algorithm != "sha256" {
		return nil, fmt.Errorf("%w: layer diff id %s is not sha256", ErrInvalid, want)
	}
	rc, err := l.Layer.Uncompressed()
	if err != nil {
		return nil, err
	}
	return &diffIDReader{rc: rc, h: sha256.New(), want: want, layer: l}, nil
}

// diffIDReader hashes a layer's uncompressed stream and fails the read
// that reaches EOF if the hash is not the diff id. mutate.Extract reads
// every layer to EOF, so each layer is checked.
type diffIDReader struct {
	rc    io.ReadCloser
	h     hash.Hash
	n     int64
	want  v1.Hash
	layer *verifiedLayer
}

func (r *diffIDReader) Read(p []byte) (int, error) {
	n, err := r.rc.Read(p)
	r.h.Write(p[:n])
	r.n += int64(n)
	if errors.Is(err, io.EOF) {
		if got := hex.EncodeToString(r.h.Sum(nil)); got != r.want.Hex {
			verr := fmt.Errorf("%w: layer content has diff id sha256:%s, config says %s", ErrInvalid, got, r.want)
			r.layer.finish(r.n, verr)
			return n, verr
		}
		r.layer.finish(r.n, nil)
	}
	return n, err
}

func (r *diffIDReader) Close() error { return r.rc.Close() }

// capReader counts bytes read by all readers sharing total and fails once
// it passes limit or ctx ends.
type capReader struct {
	r     io.Reader
	ctx   context.Context
	n     int64
	total *atomic.Int64
	limit int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.total.Add(int64(n)) > c.limit {
		return n, fmt.Errorf("%w: more than %d bytes downloaded", ErrLimit, c.limit)
	}
	return n, err
}

// detectArchive tells a docker-save tarball from an OCI-layout tarball by
// their top-level files.
func detectArchive(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	if magic, _ := br.Peek(4); bytes.HasPrefix(magic, []byte{0x1f, 0x8b}) || bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}) {
		return "", fmt.Errorf("%w: archive is compressed; decompress it first (gunzip / zstd -d)", ErrInvalid)
	}
	var docker, ociLayout, index bool
	tr := tar.NewReader(br)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("%w: not a tar archive: %v", ErrInvalid, err)
		}
		switch strings.TrimPrefix(hdr.Name, "./") {
		case "manifest.json":
			docker = true
		case "oci-layout":
			ociLayout = true
		case "index.json":
			index = true
		}
	}
	switch {
	case docker: // docker save from Docker 25+ holds an OCI layout too; manifest.json covers both.
		return archiveDocker, nil
	case ociLayout && index:
		return archiveOCI, nil
	}
	return "", fmt.Errorf("%w: neither a docker-save archive (manifest.json) nor an OCI layout (oci-layout, index.json)", ErrInvalid)
}

var layoutBlobRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^blobs/(sha256|sha384|sha512)/[0-9a-f]{64,128}$`) })

// extractLayoutTar unpacks the OCI layout in the tarball at p into dir. Only
// oci-layout, index.json and blobs/<alg>/<hex> regular files are taken;
// everything else (symlinks, other files) is ignored, so nothing can land
// outside dir.
func extractLayoutTar(ctx context.Context, p, dir string, lim Limits) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var total, entries int64
	tr := tar.NewReader(bufio.NewReaderSize(f, 1<<20))
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: read layout archive: %v", ErrInvalid, err)
		}
		if entries++; entries > lim.MaxEntries {
			return fmt.Errorf("%w: more than %d entries", ErrLimit, lim.MaxEntries)
		}
		n := strings.TrimPrefix(hdr.Name, "./")
		if hdr.Typeflag != tar.TypeReg || !(n == "oci-layout" || n == "index.json" || layoutBlobRE().MatchString(n)) {
			continue
		}
		if total += hdr.Size; hdr.Size < 0 || total > lim.MaxBytes {
			return fmt.Errorf("%w: layout archive holds more than %d bytes", ErrLimit, lim.MaxBytes)
		}
		dst := filepath.Join(dir, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue // a repeated blob: its digest is checked later anyway
		}
		if err != nil {
			return fmt.Errorf("%w: layout entry %s: %v", ErrInvalid, n, err)
		}
		_, err = io.Copy(out, io.LimitReader(tr, hdr.Size))
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
}

// imageFromLayout returns the single linux/amd64 image in the OCI layout
// at dir, after checking the manifest against its digest, and the
// annotations of its entry in index.json.
func imageFromLayout(dir string) (v1.Image, map[string]string, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: read OCI layout: %v", ErrInvalid, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: read OCI layout: %v", ErrInvalid, err)
	}
	return pickImage(p, idx, 0)
}

// pickImage finds the one image for guestPlatform in idx, descending into
// nested indexes. It also returns the annotations of the chosen entry of
// the outermost index.
func pickImage(p layout.Path, idx v1.ImageIndex, depth int) (v1.Image, map[string]string, error) {
	if depth > 4 {
		return nil, nil, fmt.Errorf("%w: OCI indexes nested too deep", ErrInvalid)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: read index: %v", ErrInvalid, err)
	}
	var cands []v1.Descriptor
	for _, d := range im.Manifests {
		if d.Platform != nil && !d.Platform.Satisfies(guestPlatform) {
			continue
		}
		switch d.MediaType {
		case types.OCIManifestSchema1, types.DockerManifestSchema2, types.OCIImageIndex, types.DockerManifestList:
			cands = append(cands, d)
		}
	}
	if len(cands) != 1 {
		return nil, nil, fmt.Errorf("%w: OCI layout holds %d candidate images for %s/%s, want exactly 1",
			ErrInvalid, len(cands), guestPlatform.OS, guestPlatform.Architecture)
	}
	d := cands[0]
	raw, err := p.Bytes(d.Digest)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: read manifest %s: %v", ErrInvalid, d.Digest, err)
	}
	if got := sha256Hex(raw); d.Digest.Algorithm != "sha256" || got != d.Digest.Hex {
		return nil, nil, fmt.Errorf("%w: manifest %s has digest sha256:%s", ErrInvalid, d.Digest, got)
	}
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: read index %s: %v", ErrInvalid, d.Digest, err)
		}
		img, _, err := pickImage(p, child, depth+1)
		return img, d.Annotations, err
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: read image %s: %v", ErrInvalid, d.Digest, err)
	}
	return img, d.Annotations, nil
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// shortDigest abbreviates "sha256:<hex>" for progress lines.
func shortDigest(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}
