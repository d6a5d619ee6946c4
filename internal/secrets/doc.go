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
// certificate for a host that cannot be reached and verified.
//
// ALPN: "h2" is offered to the upstream only when the guest's ClientHello
// offers it, and to the guest only when the upstream chose it; otherwise
// both sides get "http/1.1" alone. The two sides therefore always speak the
// same version, and a guest's HTTP/2 streams map one to one onto streams
// of the one upstream connection (which the egress engine dialed, after its
// policy checks, before the guest's handshake completed).
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
// # HTTP/2
//
// An HTTP/2 connection is served by golang.org/x/net/http2's server (which
// refuses what HTTP/2 forbids: connection-specific fields, TE other than
// "trailers", malformed pseudo-headers, a body that disagrees with its
// Content-Length) and each stream is relayed as one stream of the upstream
// connection by net/http's HTTP/2 client. Every stream gets the HTTP/1.1
// rules: :authority (and any Host field) must name the TLS server name;
// CONNECT (extended CONNECT too) and declared request trailers are
// refused; placeholders are checked and injected exactly as above (header
// values, query, path, Basic credentials; bodies checked, never rewritten,
// up to 1 MiB whole, beyond that or of unknown length streamed through a
// Guard); responses are scrubbed the same way. The bodies a connection's
// streams hold whole at once are bounded (4 MiB): a body that finds the
// budget spent is streamed instead (a request body then through a Guard, a
// response without an exact Content-Length). Interim 1xx responses are
// not relayed (the server answers 100-continue itself). Limits: 100
// concurrent streams per connection, the header list bounded by
// MaxHeaderBytes, flow-control windows of 256 KiB per stream and 1 MiB per
// connection on both sides (what a peer may send before the interceptor
// reads), an upstream response header list of at most 1 MiB; an idle
// connection is closed after IdleTimeout and a silent one is pinged. A
// refusal or an upstream failure answers that stream (a 4xx/502, or a
// stream reset when its response had started) and ends the connection
// gracefully (GOAWAY: streams in flight finish); so does the upstream
// connection ending.
//
// # WebSocket
//
// An HTTP/1.1 WebSocket opening handshake (a GET without a body, one
// "Upgrade: websocket", "upgrade" in Connection, one Sec-WebSocket-Key and
// "Sec-WebSocket-Version: 13") is checked and injected like any request,
// and the upstream's 101 is scrubbed like any response head. After the 101
// the bytes are relayed both ways as they are: nothing in WebSocket frames
// is injected, checked for placeholders (a client's frames are masked) or
// scrubbed, so a host that echoes the handshake's headers in a message
// hands the guest the value. Each direction ends after UpstreamTimeout
// without bytes. Other upgrades (h2c included), and WebSocket over HTTP/2
// (extended CONNECT), are refused.
//
// # Header scope
//
// A secret with [Binding.Header] set (`--secret NAME@host:Header-Name`) is
// injected into that request header field only (its name matched
// case-insensitively, a Basic credential in it included). A request to
// one of the secret's hosts that carries its placeholder anywhere else (in
// another field's name or value, the request target, or the body, plain or
// encoded as the Scanner knows) is refused like a placeholder toward
// another host. Toward other hosts it is refused as before.
//
// Placeholders of secrets bound to the host are replaced by their values in
// every header value (inside the base64 of an Authorization or
// Proxy-Authorization "Basic" credential too), in the query (query-escaped)
// and in the path (path-escaped). A value holding a colon is refused as the
// user-id of a Basic credential (it would move the user-id/password split,
// and a host echoing the two would return pieces of it). Placeholders of any
// other secret, plain or encoded as the Scanner knows, in the request line,
// headers or body stop the request ("net.secret.block"): a body of known
// length up to 1 MiB is read whole and checked before the upstream sees
// anything; a larger or chunked body is streamed through a [Guard], so the
// upstream may have received the head and part of the body when the
// connection is cut. Bodies are never rewritten.
//
// Every request is sent with "Accept-Encoding: identity" and without TE; a
// request carrying a value is sent without Range and If-Range (a server may
// ignore a range, so a client must cope with the whole response), and a 206
// answer to it is refused with a 502: a range could cut the value into
// pieces that no scrubber recognises.
//
// Responses are scrubbed: in response headers and bodies, every form in
// which the interceptor put a value on the wire is replaced by the same
// form of its placeholder (a header whose name carries one is dropped):
//
//   - the raw value; its url.QueryEscape and url.PathEscape forms, with
//     upper- and lower-case hex;
//   - the exact Basic credentials built for this connection's requests
//     (the first 16, up to 1 KiB each), in standard and URL-safe base64,
//     padded or not, which become the guest's own credential again;
//   - the base64 of the value after any prefix and before any suffix, in
//     both alphabets and at the three byte alignments: the run of
//     characters that depends on the value alone is replaced by the
//     placeholder's run, and the characters on either side, which mix the
//     value's first or last bits with the prefix or suffix, are rewritten
//     so that none of the value's bits remain (the surrounding base64 no
//     longer decodes to prefix+placeholder+suffix exactly). Runs shorter
//     than 8 characters (values under about 6 bytes) are not scrubbed in
//     this form;
//   - the forms above HTML-escaped (Go's and Python's entities);
//   - each of these as JSON encoders escape it, in every combination of
//     the usual escapes (`\"` or `\u0022`, `\/`, `\u003c`/`\u003C` for
//     `<>&`, `\u002b`/`\u002B` for `+`, `\u0027`, `\uXXXX` for non-ASCII).
//
// A body with Content-Encoding gzip, x-gzip or deflate (zlib or raw) is
// decompressed, scrubbed and sent identity-encoded (Content-Encoding,
// Content-Length and digests of the encoded body removed); decompression is
// streamed at the pace the guest reads, never buffered beyond 1 MiB. Any
// other coding (br, zstd, compress, unknown, or two codings) is refused
// with a 502 and a "net.secret.block" event. A body of known length up to
// 1 MiB (after decoding) keeps an exact Content-Length, larger ones are
// re-framed as chunked. Response trailers are dropped.
//
// One audit [Event] is emitted per request with an injected value
// ("net.secret.inject"), per refusal ("net.secret.block") and per TLS or
// upstream failure ("net.secret.error"). Values never appear in events, logs
// or errors; error text that might echo upstream bytes is scrubbed.
//
// # Not supported
//
//   - HTTP/2 toward an upstream that does not negotiate it (the guest then
//     gets http/1.1), HTTP/2 without TLS (h2c, and the preface on an
//     HTTP/1.1 connection), and HTTP/1.0 requests.
//   - Protocol upgrades other than WebSocket over HTTP/1.1; anything inside
//     WebSocket frames (see WebSocket above).
//   - A host that transforms a value beyond the forms above before
//     returning it: other encodings (hex, base32, base64 wrapped across
//     lines or of a percent-encoded form, double escaping, encryption,
//     compression inside a body, such as a gzip file or a compressed
//     cookie), or pieces of it (a value split at a delimiter the host
//     parses, such as ';' in a cookie or ',' in a list header, truncated,
//     or served in ranges to a later request that carried no value). A
//     host a secret is bound to is trusted not to do so; an echo of the
//     request, verbatim or decoded and re-encoded as JSON, is covered.
//   - Reflected values in response trailers (they are dropped).
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
