// Package airlock is the Go client for the airlock HTTP API (`airlock serve`).
//
// It uses only the standard library. Every method takes a context that bounds
// the whole call, streams included; the Client itself sets no timeout, so
// long-running execs and large file transfers are limited only by the context.
//
//	c := airlock.New("http://127.0.0.1:8080", os.Getenv("AIRLOCK_API_KEY"))
//	sb, err := c.Create(ctx, airlock.CreateOptions{Image: "base"})
//	if err != nil { ... }
//	defer c.Kill(context.WithoutCancel(ctx), sb.ID)
//	res, err := c.Run(ctx, sb.ID, airlock.ExecRequest{Cmd: []string{"python3", "-c", "print(6*7)"}})
//
// Errors returned by the server are *APIError values; match them by category
// with errors.Is against ErrNotFound, ErrUnauthenticated, ErrQuota, ErrInvalid
// and ErrConflict. Exec output travels base64-encoded on the wire, so bytes
// round-trip exactly, and an exec stream that ends without its exit record
// yields a *StreamError (errors.Is(err, ErrStreamBroken)) that carries the exec
// ID for Attach.
//
// A Client is safe for concurrent use by multiple goroutines.
package airlock
