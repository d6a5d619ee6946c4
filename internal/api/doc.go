// Package api is airlock's HTTP API v1, whose contract is api/openapi.yaml:
// a net/http ServeMux with one file per resource over a narrow Service
// interface that *sandbox.Manager implements.
//
// Every /v1 route authenticates a Bearer key (store.LookupKey), applies the
// key's tenant rate limit, and scopes sandboxes by tenant: a sandbox of
// another tenant is answered exactly like a missing one. Errors carry a
// public message and a request id; details go only to the log.
//
// The server also serves the web dashboard (dashboard.go, files from
// internal/dashboard) at / and /ui/. Signing in with a key makes a session
// (session.go) whose cookie stands in for the key on /v1 routes other than
// the preview route, with a CSRF header on state changes and a same-origin
// Origin on WebSockets; the pages do everything through /v1.
package api
