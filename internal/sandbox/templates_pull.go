package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/image"
)

// FROM an OCI reference. The server pulls the image itself, so a tenant
// could make it connect anywhere it can reach: for API keys, registries
// are refused unless an admin allows them by host
// (Manager.TemplateRegistries, serve --template-registry); the local CLI
// user pulls from any. The image becomes a blob that no image name
// refers to (the catalog's names are every tenant's); the tenant's build
// cache records which manifest it was made from, and the step keys start
// from that manifest's digest, so a tag that moves rebuilds.

// NormalizeRegistry is the host a registry is known by: docker.io and
// index.docker.io are Docker Hub's one registry.
func NormalizeRegistry(host string) string {
	host = strings.ToLower(strings.TrimSpace(host))
	if host == "docker.io" || host == "registry-1.docker.io" {
		return name.DefaultRegistry
	}
	return host
}

// registryRef parses FROM's argument as an OCI reference whose registry
// c may pull from: the local user (the host's own CLI, which may pull any
// image anyway) any, an API key those the server allows. allowed is false
// (registry names the reference's registry, for the error) when it parses
// but its registry is not allowed.
func (m *Manager) registryRef(c Caller, from string) (ref name.Reference, registry string, allowed bool) {
	if !strings.ContainsAny(from, "/:@") {
		// A bare name is an image of this server's, never Docker Hub's.
		return nil, "", false
	}
	r, err := name.ParseReference(from)
	if err != nil {
		return nil, "", false
	}
	registry = r.Context().RegistryStr()
	allowed = c.Local() || slices.ContainsFunc(m.TemplateRegistries, func(h string) bool { return NormalizeRegistry(h) == registry })
	return r, registry, allowed
}

// pullBase resolves FROM ref to an image blob of the tenant's build cache,
// pulling it when the registry's manifest is not the one the cache holds.
// It returns the build's base ("digest:...") and its key.
func (m *Manager) pullBase(ctx context.Context, c Caller, ref name.Reference, progress func(BuildEvent)) (base, key string, err error) {
	if err := m.CheckSpace(ctx, "pulling "+ref.String(), 0); err != nil {
		return "", "", err
	}
	manifest, err := image.RemoteDigest(ctx, ref.String())
	if err != nil {
		return "", "", fmt.Errorf("FROM %s: %w: %v", ref, errdefs.ErrUnavailable, err)
	}
	record := filepath.Join(m.L.Root, layersDir, tenantKey(c.Tenant), "pull-"+keyName(ref.String()))
	if b, err := os.ReadFile(record); err == nil {
		if cached, blob, ok := strings.Cut(string(b), " "); ok && cached == manifest {
			if _, err := os.Stat(m.images().Path(image.Image{Digest: blob})); err == nil {
				progress(BuildEvent{Kind: "status", Message: fmt.Sprintf("FROM %s: %s (pulled before)", ref, manifest)})
				return "digest:" + blob, "oci:" + manifest, nil
			}
		}
	}
	progress(BuildEvent{Kind: "status", Message: fmt.Sprintf("pulling %s (%s)", ref, manifest)})
	pw := &progressWriter{progress: progress}
	img, _, err := m.images().PullBlob(ctx, ref.String(), pw)
	if err != nil {
		return "", "", fmt.Errorf("FROM %s: %w", ref, err)
	}
	if err := os.MkdirAll(filepath.Dir(record), 0o700); err != nil {
		return "", "", err
	}
	// The digest the registry answered for the reference (an index's, for
	// a multi-platform image) is what a later build compares.
	if err := os.WriteFile(record+".tmp", []byte(manifest+" "+img.Digest), 0o600); err == nil {
		_ = os.Rename(record+".tmp", record)
	}
	return "digest:" + img.Digest, "oci:" + manifest, nil
}

// progressWriter turns an image pull's progress lines into status events.
type progressWriter struct {
	progress func(BuildEvent)
	buf      []byte
}

func (w *progressWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	for {
		line, rest, ok := strings.Cut(string(w.buf), "\n")
		if !ok {
			break
		}
		w.buf = []byte(rest)
		if line = strings.TrimSpace(line); line != "" {
			w.progress(BuildEvent{Kind: "status", Message: line})
		}
	}
	if len(w.buf) > 4096 {
		w.buf = w.buf[:0]
	}
	return len(b), nil
}

var _ io.Writer = (*progressWriter)(nil)
