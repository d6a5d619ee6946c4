// Package e2b serves E2B's API (the control-plane REST routes E2B's
// official SDKs call to create, connect to, list, inspect, time out, pause,
// kill, snapshot and fork sandboxes, and envd's in-sandbox API for commands
// and files)
// over airlock's control plane, so that a program
// written against `e2b` on npm or PyPI runs on airlock with E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY set.
//
// It is an adapter: it translates E2B's JSON to the manager's calls
// (api.Sandboxes, api.Snapshots) for the caller the API authenticated
// (keys in X-API-KEY, tenants, quotas, rate limits and audit exactly as
// for /v1) and the
// manager's answers and errors back to E2B's shapes ({"code": <status>,
// "message": ...}; a missing sandbox is 404 with code 404, which the SDK's
// kill() reads as false). It decides nothing.
//
// Mapping:
//   - templateID is a template of the tenant (`airlock template build`)
//     or an airlock image name; "code-interpreter-v1" (the
//     default of @e2b/code-interpreter) is the image "base", which has
//     Python and a Jupyter kernel.
//   - timeout (seconds; 300 when omitted) is the sandbox's lifetime;
//     envVars its default environment; metadata its metadata;
//     allow_internet_access false, or network.denyOut 0.0.0.0/0, its
//     network mode "deny" with network.allowOut as its allow rules. What
//     airlock does not do (other denyOut entries, request rules, egress
//     proxies, public traffic, pause on timeout, volumes, MCP, IAM) is
//     refused, never ignored.
//   - E2B's "running" is airlock's creating, running or resuming; "paused"
//     is pausing or paused; failed sandboxes are not listed.
//   - connect resumes a paused sandbox (201) or answers a running one
//     (200), and sets its timeout when asked.
//   - A snapshot is an airlock snapshot of the caller's tenant: its name
//     is E2B's snapshotID and its only name (generated, "snap-" and 10
//     base32 characters, when the request has none). Lists are newest
//     first, filtered by source sandbox and name, paged like sandboxes;
//     DELETE /templates/{id} removes snapshots only. A create whose
//     templateID names one of the tenant's snapshots starts from it (its
//     env and network are the snapshot's: envVars are refused).
//   - fork makes count (default 1) copies, all or none, each with the
//     request's timeout (300 s when omitted) rather than the source's.
//   - A network update (PUT /sandboxes/{id}/network) replaces the
//     sandbox's whole egress policy, mapped as a create's network is, through
//     the manager's SetNetwork (the same validation, platform floor and
//     audit as /v1's PUT .../network): rules change at once and open
//     connections the new policy forbids are closed; a paused sandbox gets
//     it on resume. Metrics are one sample of the guest's own account of
//     its CPU, memory and root filesystem. A sandbox the caller cannot see
//     is 404.
//   - The domain of a create is the API's preview domain (serve
//     --preview-domain), where getHost(port) is served; the
//     trafficAccessToken is the sandbox's preview token.
//
// In-sandbox traffic (envd's Connect RPCs process.Process and
// filesystem.Filesystem with the JSON codec, /files and /health) comes to
// the same listener with an E2b-Sandbox-Id header (E2B_SANDBOX_URL points
// the SDK there). It carries no API key: the sandbox's envdAccessToken, an
// HMAC of its id under the catalog's secret, authorizes it, and the
// manager acts for the sandbox's tenant. A process is an exec owned by the
// sandbox's shim, named by its guest pid.
//
// Not served yet (see the README): PTY sessions and directory watching
// (501); autoPause, lifecycle and network
// rules of a create are refused or ignored as the README says. A create's
// volumeMounts mount the tenant's airlock volumes read-write.
package e2b
