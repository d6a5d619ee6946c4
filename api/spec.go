// Package api holds the HTTP API's contract, api/openapi.yaml, embedded in
// the binary so that `airlock serve` serves the spec of the API it runs
// (GET /v1/openapi.yaml).
package api

import _ "embed" // the spec

//go:embed openapi.yaml
var openAPI string

// OpenAPI returns the bytes of api/openapi.yaml as built into this binary.
func OpenAPI() string { return openAPI }
