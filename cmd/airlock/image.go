package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// catalogIndex backs the image store's name index with the SQLite catalog.
type catalogIndex struct{ st *store.Store }

func (c catalogIndex) PutImage(ctx context.Context, im image.Image) error {
	return c.st.PutImage(ctx, store.ImageRecord{Name: im.Name, Digest: im.Digest, Size: im.Size, Created: im.Created, Source: im.Source})
}

func (c catalogIndex) GetImage(ctx context.Context, name string) (image.Image, error) {
	r, err := c.st.GetImage(ctx, name)
	if err != nil {
		return image.Image{}, err // errdefs.ErrNotFound (= image.ErrNotFound) when absent
	}
	return image.Image{Name: r.Name, Digest: r.Digest, Size: r.Size, Created: r.Created, Source: r.Source}, nil
}

func (c catalogIndex) ListImages(ctx context.Context) ([]image.Image, error) {
	rs, err := c.st.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]image.Image, 0, len(rs))
	for _, r := range rs {
		out = append(out, image.Image{Name: r.Name, Digest: r.Digest, Size: r.Size, Created: r.Created, Source: r.Source})
	}
	return out, nil
}

func (c catalogIndex) DeleteImage(ctx context.Context, name string) error {
	return c.st.DeleteImage(ctx, name)
}

// images opens the image store over the catalog.
func (g *globals) images(ctx context.Context) (*image.Store, func(), error) {
	if err := os.MkdirAll(g.stateDir, 0o755); err != nil {
		return nil, nil, err
	}
	st, err := store.Open(ctx, statedir.Layout{Root: g.stateDir}.Catalog())
	if err != nil {
		return nil, nil, err
	}
	return image.NewStore(g.stateDir, catalogIndex{st}, g.log), func() { st.Close() }, nil
}

func imageCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Manage root filesystem images"}
	var name string
	withStore := func(run func(ctx context.Context, s *image.Store, args []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			s, done, err := g.images(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			return run(cmd.Context(), s, args)
		}
	}
	var asJSON bool
	ls := &cobra.Command{Use: "ls", Short: "List images", Args: cobra.NoArgs,
		RunE: withStore(func(ctx context.Context, s *image.Store, _ []string) error {
			list, err := s.List(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				out := make([]imageJSON, 0, len(list))
				for _, im := range list {
					out = append(out, imageJSON{Name: im.Name, Digest: im.Digest, SizeBytes: im.Size, Created: im.Created.UTC(), Source: im.Source})
				}
				return writeJSON(os.Stdout, out)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tDIGEST\tSIZE\tCREATED\tSOURCE")
			for _, im := range list {
				d := im.Digest
				if len(d) > 19 {
					d = d[:19]
				}
				fmt.Fprintf(tw, "%s\t%s\t%dM\t%s\t%s\n", im.Name, d, im.Size>>20, im.Created.Format("2006-01-02 15:04"), im.Source)
			}
			return tw.Flush()
		})}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var recipe string
	build := &cobra.Command{Use: "build NAME", Short: "Build an image from Debian packages: base (the default image) or browser (Chromium)", Args: cobra.ExactArgs(1),
		Long: "Build an image from Debian packages with mmdebstrap, from the mirrors the host's apt uses.\n" +
			"Recipes: base (Debian with Python's scientific stack and Node.js; the default image),\n" +
			"browser (Debian's Chromium, a virtual screen, a live view over noVNC, fonts; see 'airlock browser').\n" +
			"The recipe is --recipe, or NAME when NAME is a recipe's name, or base.",
		RunE: withStore(func(ctx context.Context, s *image.Store, args []string) error {
			r, ok := image.RecipeNamed(cmp.Or(recipe, args[0]))
			switch {
			case !ok && recipe != "":
				return fmt.Errorf("unknown recipe %q (known: %s)", recipe, recipeNames())
			case !ok:
				r = image.BaseRecipe
			}
			im, err := s.Build(ctx, args[0], r, os.Stderr)
			if err != nil {
				return err
			}
			fmt.Println(im.Name, im.Digest)
			return nil
		})}
	build.Flags().StringVar(&recipe, "recipe", "", "what to build: "+recipeNames())
	imp := &cobra.Command{Use: "import FILE.tar", Short: "Import a docker-save or OCI-layout tarball", Args: cobra.ExactArgs(1),
		RunE: withStore(func(ctx context.Context, s *image.Store, args []string) error {
			im, err := s.Import(ctx, name, args[0], os.Stderr)
			if err != nil {
				return err
			}
			fmt.Println(im.Name, im.Digest)
			return nil
		})}
	imp.Flags().StringVar(&name, "name", "", "image name (default: from the tarball's tag or file name)")
	pull := &cobra.Command{Use: "pull REF", Short: "Pull an image from an OCI registry", Args: cobra.ExactArgs(1),
		RunE: withStore(func(ctx context.Context, s *image.Store, args []string) error {
			im, err := s.Pull(ctx, args[0], name, os.Stderr)
			if err != nil {
				return err
			}
			fmt.Println(im.Name, im.Digest)
			return nil
		})}
	pull.Flags().StringVar(&name, "name", "", "image name (default: derived from REF)")
	rm := &cobra.Command{Use: "rm NAME", Short: "Remove an image", Args: cobra.ExactArgs(1),
		RunE: withStore(func(ctx context.Context, s *image.Store, args []string) error {
			im, err := s.Get(ctx, args[0])
			if err != nil {
				return err
			}
			l, users, tpls, err := sandboxesByImage(ctx, g)
			if err != nil {
				return err
			}
			if t := tpls[im.Digest]; t != "" && !strings.HasPrefix(t, "snapshot ") {
				return fmt.Errorf("%w: image %q is used by %s (remove it first)", errdefs.ErrConflict, im.Name, t)
			}
			for _, sb := range users[im.Digest] {
				if sb.State != store.StateFailed {
					return fmt.Errorf("%w: image %q is used by sandbox %s (remove it first)", errdefs.ErrConflict, im.Name, sb.ID)
				}
			}
			if err := s.Remove(ctx, args[0]); err != nil {
				return err
			}
			if _, err := os.Stat(s.Path(im)); errors.Is(err, os.ErrNotExist) {
				// The blob is gone: drop the templates booted from it.
				if err := template.RemoveForImage(l, im.Digest); err != nil {
					return err
				}
			}
			fmt.Println(args[0])
			return nil
		})}
	prune := &cobra.Command{Use: "prune", Short: "Remove image blobs and extracted trees that no name and no sandbox uses", Args: cobra.NoArgs,
		RunE: withStore(func(ctx context.Context, s *image.Store, _ []string) error {
			l, users, tpls, err := sandboxesByImage(ctx, g)
			if err != nil {
				return err
			}
			removed, err := s.Prune(ctx, func(d string) bool { return len(users[d]) > 0 || tpls[d] != "" })
			for _, d := range removed {
				if rerr := template.RemoveForImage(l, d); rerr != nil {
					err = errors.Join(err, rerr)
				}
				fmt.Println(d)
			}
			return err
		})}
	cmd.AddCommand(ls, build, imp, pull, rm, prune)
	return cmd
}

// sandboxesByImage returns the catalog's sandboxes by image digest, and
// the state dir's layout (for the templates of an image).
// It also returns the image digests that templates and snapshots start
// from (a gvisor template's image, a snapshot's image), each with a name
// for errors.
func sandboxesByImage(ctx context.Context, g *globals) (statedir.Layout, map[string][]store.Sandbox, map[string]string, error) {
	m, done, err := g.manager(ctx)
	if err != nil {
		return statedir.Layout{}, nil, nil, err
	}
	defer done()
	sbs, err := m.List(ctx, sandbox.Local())
	if err != nil {
		return statedir.Layout{}, nil, nil, err
	}
	by := map[string][]store.Sandbox{}
	for _, sb := range sbs {
		by[sb.ImageDigest] = append(by[sb.ImageDigest], sb)
	}
	ts, err := m.Store.ListTemplates(ctx, "", true)
	if err != nil {
		return statedir.Layout{}, nil, nil, err
	}
	tpls := map[string]string{}
	for _, t := range ts {
		if t.ImageDigest != "" {
			tpls[t.ImageDigest] = "template " + t.Name
		}
	}
	// Snapshots (a qemu template's saved states and build steps among
	// them) sit on their image's blob, which may have no name (a template
	// FROM a pulled reference).
	sns, err := m.Store.ListSnapshots(ctx, "", true)
	if err != nil {
		return statedir.Layout{}, nil, nil, err
	}
	for _, sn := range sns {
		if _, ok := tpls[sn.ImageDigest]; !ok && sn.ImageDigest != "" {
			tpls[sn.ImageDigest] = "snapshot " + sn.Name
		}
	}
	return m.L, by, tpls, nil
}

// imageJSON is one image in `image ls --json`.
type imageJSON struct {
	Name      string    `json:"name"`
	Digest    string    `json:"digest"`
	SizeBytes int64     `json:"size_bytes"`
	Created   time.Time `json:"created"`
	Source    string    `json:"source"`
}

// recipeNames lists the recipes of `image build`.
func recipeNames() string {
	var names []string
	for _, r := range image.Recipes() {
		names = append(names, r.Name)
	}
	return strings.Join(names, ", ")
}
