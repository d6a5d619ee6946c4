// Package mcp serves airlock over the Model Context Protocol (the official
// Go SDK, github.com/modelcontextprotocol/go-sdk): `airlock mcp` on stdio
// and /mcp of `airlock serve` over streamable HTTP.
//
// It is an adapter: it translates tool calls into calls on a narrow
// Service (the sandbox manager) and never decides policy itself. Each MCP
// session gets its own mcp.Server, so the sandboxes a session created are
// its resources (airlock://sandbox/<id>) and are removed when the session
// ends (unless Config.KeepSandboxes). A session acts as one Principal: over
// HTTP the API key that opened it (its tenant; later requests must carry
// the same key), on stdio the local user (tenant "").
//
// Guard rails: tool text is capped (Config.MaxOutputBytes, 64 KiB by
// default) with a truncation note; every call has a deadline (timeout_s,
// Config.DefaultTimeout 60 s, at most Config.MaxTimeout); file tools act
// only on paths inside a sandbox: no tool reads or writes host files, so
// there is no host-path allowlist to configure.
//
// The browser tools (browser*.go) drive the Chromium of a sandbox made from
// the browser image over the Chrome DevTools Protocol with chromedp,
// through Service.DialBrowser: navigate, an accessibility snapshot whose
// element refs the click, type, press and scroll tools take, text,
// screenshots as MCP images, JavaScript, tabs and downloads into the
// sandbox. Without sandbox_id they use the session's own browser sandbox.
package mcp
