package api

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"time"

	spec "github.com/airlock-sandbox/airlock/api"
)

// specETag is the strong ETag of the embedded spec.
var specETag = func() string {
	sum := sha256.Sum256([]byte(spec.OpenAPI()))
	return `"` + hex.EncodeToString(sum[:16]) + `"`
}()

// openAPI serves api/openapi.yaml as built into this binary, without
// authentication: the spec holds nothing of the server's (conditional
// GETs are answered 304).
func (s *Server) openAPI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/yaml")
	h.Set("ETag", specETag)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	http.ServeContent(w, r, "", time.Time{}, strings.NewReader(spec.OpenAPI()))
}
