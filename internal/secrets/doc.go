// Package secrets is the host side of "secrets that never enter the guest".
//
// A sandbox started with `--secret OPENAI_API_KEY@api.openai.com` sees only a
// placeholder, "airlock-secret-" followed by 32 lower-case hex digits, in its
// environment. The real value stays in host memory. The host's user-space
// network (internal/egress) terminates every guest TCP flow; a flow to a host
// that has a secret is handed to [Interceptor.Serve], and every other flow
// can be guarded with a [Scanner] so that placeholders do not leave the
// sandbox towards hosts they are not bound to.
//
// # Interception
//
// Serve terminates the guest's TLS with a certificate for the ClientHello's
// server name, issued by an in-memory [CA] whose certificate is installed in
// the guest's trust store. The CA's key is generated in memory and never
// serialised; its certificate carries critical name constraints for the
// secret-bearing hosts only (and excludes every IP address), so trusting it
// lets nobody impersonate other hosts. Before presenting a certificate Serve
// refuses an empty or malformed server name and one no secret is bound to,
// calls the flow's CheckSNI (policy and DNS-pin checks), and completes a
// verified TLS handshake with the real upstream, so a guest never gets a
// certificate for a host that cannot be reached and verified. Only
// "http/1.1" is offered in ALPN on both sides.
//
// Each request head is checked byte by byte before Go's parser sees it, so
// that nothing two HTTP parsers could read differently is forwarded: bare CR
// or LF, control bytes, obs-fold, malformed or duplicate Content-Length,
// Transfer-Encoding other than one "chunked", Content-Length with
// Transfer-Encoding, a missing or repeated Host, CONNECT, Upgrade and
// HTTP2-Settings, the HTTP/2 preface, request trailers and any version but
// HTTP/1.1 are refused with a short plain-text 4xx/5xx response, after which
// the connection is closed. The Host header (and an absolute-form URL's
// authority) must name the TLS server name (with any port: the guest's
// destination port was already decided by the egress policy), so the SNI,
// the Host and the secret's host always agree before anything is injected.
//
// Placeholders of secrets bound to the host are replaced by their values in
// every header value (inside the base64 of an Authorization or
// Proxy-Authorization "Basic" credential too), in the query (query-escaped)
// and in the path (path-escaped). Placeholders of any other secret, plain or
// encoded as the Scanner knows, in the request line, headers or body stop
// the request ("net.secret.block"): a body of known length up to 1 MiB is
// read whole and checked before the upstream sees anything; a larger or
// chunked body is streamed through a [Guard], so the upstream may have
// received the head and part of the body when the connection is cut. Bodies
// are never rewritten.
//
// Responses are scrubbed: every real value of the interceptor's secrets in a
// response header is replaced by its placeholder, and so it is in a body
// that is not content-encoded (a body of known length up to 1 MiB keeps an
// exact Content-Length, larger ones are re-framed as chunked). Response
// trailers are dropped.
//
// One audit [Event] is emitted per request with an injected value
// ("net.secret.inject"), per refusal ("net.secret.block") and per TLS or
// upstream failure ("net.secret.error"). Values never appear in events, logs
// or errors; error text that might echo upstream bytes is scrubbed.
//
// # Not supported
//
//   - HTTP/2 to the guest (only http/1.1 is offered; the preface is refused)
//     and HTTP/1.0 requests.
//   - Protocol upgrades: WebSocket and h2c.
//   - Scrubbing reflected values from compressed (any Content-Encoding)
//     response bodies, from encoded forms of a value (base64, percent-
//     encoding), or from response trailers (they are dropped).
//   - Injection into request bodies, and into encoded placeholders other than
//     a Basic credential.
//   - Detection of placeholders hidden by encodings the Scanner does not
//     know; what stops exfiltration of a secret is that the guest never has
//     its value, the placeholder checks catch accidents and naive attempts.
//   - Pipelining: requests are relayed one at a time; while a request body
//     is being sent, an early upstream response is not read.
//   - Name constraints are DNS subtrees: a CA made for "api.x.com" would
//     also be valid for "a.api.x.com", though Leaf never issues such a name
//     unless a pattern matches it.
package secrets
