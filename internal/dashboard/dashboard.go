package dashboard

import (
	"embed"
	"html/template"
	"io/fs"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// Pages are the page templates: "sign-in.html", "list.html",
// "sandbox.html", "server.html" and "error.html", each a complete page built on "head"
// and "foot" (layout.html).
var Pages = template.Must(template.ParseFS(templateFiles, "templates/*.html"))

// Static is the tree of static assets served under /ui/static/.
var Static = func() fs.FS {
	f, err := fs.Sub(staticFiles, "static")
	if err != nil {
		panic(err)
	}
	return f
}()
