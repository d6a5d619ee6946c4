// Package api is airlock's HTTP API v1 (api/CONTRACT.md, api/openapi.yaml):
// a net/http ServeMux with one file per resource over a narrow Service
// interface that *sandbox.Manager implements.
//
// Every /v1 route authenticates a Bearer key (store.LookupKey), applies the
// key's tenant rate limit, and scopes sandboxes by tenant: a sandbox of
// another tenant is answered exactly like a missing one. Errors carry a
// public message and a request id; details go only to the log.
package api
